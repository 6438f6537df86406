/* Commit log records: decoding one, reading many with pread, encoding a batch (record.py, commitlog.py). */
#include "speedups.h"

/* Where the fields of a v1/v2 record lie (docs/format.md §3). */
typedef struct {
    int version;
    int64_t total;
    int32_t sys_flag;
    Py_ssize_t born_width, store_width;
    const unsigned char *born, *store_ts, *store, *reconsume, *body, *topic, *properties;
    int64_t body_length, topic_length, properties_length;
} Layout;

/* Set once by record.py: the Record class and the (cached) SocketAddress factory. */
static PyObject *record_type = NULL;
static PyObject *address_factory = NULL;

/* The last host seen in each role: records name few distinct hosts. */
typedef struct {
    unsigned char raw[20];
    Py_ssize_t width;
    PyObject *address;
} HostCache;
static HostCache born_cache, store_cache;

/* The last topic decoded: a key page's or a queue's records all name one topic, and a
 * topic's text is made once for them (longer names than the raw buffer are not kept). */
typedef struct {
    unsigned char raw[256];
    Py_ssize_t length;
    PyObject *text;
} TopicCache;
static TopicCache topic_cache;

static PyObject *topic_at(const unsigned char *p, Py_ssize_t length) {
    if (topic_cache.text != NULL && topic_cache.length == length && memcmp(topic_cache.raw, p, length) == 0)
        return Py_NewRef(topic_cache.text);
    PyObject *text = PyUnicode_DecodeUTF8((const char *)p, length, "replace");
    if (text == NULL || length > (Py_ssize_t)sizeof(topic_cache.raw)) return text;
    memcpy(topic_cache.raw, p, length);
    topic_cache.length = length;
    Py_XSETREF(topic_cache.text, Py_NewRef(text));
    return text;
}

/* Where each of Record's fields lies in a Record, in the order decode_at lists them, when
 * configure was given its slot names: a record is then allocated and its slots filled in
 * place, which is what the dataclass's generated __init__ does, at a fifth of the cost. */
#define RECORD_FIELDS 17
static Py_ssize_t record_slot_offsets[RECORD_FIELDS];
static int record_slots_known = 0;

/* The offset of the object slot called name in type, or -1 with an error set. */
static Py_ssize_t slot_offset(PyTypeObject *type, PyObject *name) {
    PyObject *descriptor = PyUnicode_Check(name) ? PyDict_GetItemWithError(type->tp_dict, name) : NULL;
    if (descriptor == NULL || !Py_IS_TYPE(descriptor, &PyMemberDescr_Type)
        || ((PyMemberDescrObject *)descriptor)->d_member->type != T_OBJECT_EX) {
        if (!PyErr_Occurred()) PyErr_Format(PyExc_TypeError, "configure: %R is not an object slot of the class", name);
        return -1;
    }
    return ((PyMemberDescrObject *)descriptor)->d_member->offset;
}

PyObject *configure(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3 || !PyType_Check(args[0]) || (args[2] != Py_None && !PyTuple_Check(args[2]))) {
        PyErr_SetString(PyExc_TypeError, "configure takes (Record, address, slot names: tuple | None)");
        return NULL;
    }
    record_slots_known = 0;
    if (args[2] != Py_None) {
        if (PyTuple_GET_SIZE(args[2]) != RECORD_FIELDS) {
            PyErr_Format(PyExc_TypeError, "configure: Record has %d fields", RECORD_FIELDS);
            return NULL;
        }
        for (int i = 0; i < RECORD_FIELDS; i++) {
            record_slot_offsets[i] = slot_offset((PyTypeObject *)args[0], PyTuple_GET_ITEM(args[2], i));
            if (record_slot_offsets[i] < 0) return NULL;
        }
        record_slots_known = 1;
    }
    Py_XSETREF(record_type, Py_NewRef(args[0]));
    Py_XSETREF(address_factory, Py_NewRef(args[1]));
    Py_CLEAR(born_cache.address);
    Py_CLEAR(store_cache.address);
    Py_CLEAR(topic_cache.text);
    Py_RETURN_NONE;
}

/* A Record of fields (RECORD_FIELDS new references, each consumed). */
static PyObject *new_record(PyObject **fields) {
    PyObject *record = NULL;
    if (!record_slots_known) {
        record = PyObject_Vectorcall(record_type, fields, RECORD_FIELDS, NULL);
    } else if ((record = ((PyTypeObject *)record_type)->tp_alloc((PyTypeObject *)record_type, 0)) != NULL) {
        for (int i = 0; i < RECORD_FIELDS; i++) {
            *(PyObject **)((char *)record + record_slot_offsets[i]) = fields[i];
            fields[i] = NULL;
        }
    }
    for (int i = 0; i < RECORD_FIELDS; i++) Py_CLEAR(fields[i]);
    return record;
}

/* The SocketAddress of an address (4 or 16 bytes) followed by an int32 port. */
static PyObject *host_at(HostCache *cache, const unsigned char *p, Py_ssize_t width) {
    if (cache->address != NULL && cache->width == width && memcmp(cache->raw, p, width + 4) == 0)
        return Py_NewRef(cache->address);
    PyObject *ip = PyBytes_FromStringAndSize((const char *)p, width);
    if (ip == NULL) return NULL;
    PyObject *port = PyLong_FromLong((int32_t)be32(p + width));
    if (port == NULL) {
        Py_DECREF(ip);
        return NULL;
    }
    PyObject *address = PyObject_CallFunctionObjArgs(address_factory, ip, port, NULL);
    Py_DECREF(ip);
    Py_DECREF(port);
    if (address == NULL) return NULL;
    memcpy(cache->raw, p, width + 4);
    cache->width = width;
    Py_XSETREF(cache->address, Py_NewRef(address));
    return address;
}

/* decode_record(buf, pos, check_crc, end) -> Record | None: the v1/v2 record at
 * buf[pos:], reading nothing at or past end; None for anything else (record.py then
 * decodes it and says what it is). */
/* What a key lookup keeps (commitlog.KeyMatch): NULL in a Match pointer keeps everything. */
typedef struct {
    const char *topic, *key;
    Py_ssize_t topic_length, key_length;
    long long begin_ms, end_ms, visible_begin, visible_end;
} Match;

static PyObject *decode_at(const unsigned char *buf, Py_ssize_t pos, Py_ssize_t end, int check_crc,
                           const Match *match);

PyObject *decode_record(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (!arity(nargs, 4, "decode_record takes (buf, pos, check_crc, end)")) return NULL;
    if (record_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "_speedups.configure was not called");
        return NULL;
    }
    Py_ssize_t pos = PyLong_AsSsize_t(args[1]);
    int check_crc = PyObject_IsTrue(args[2]);
    Py_ssize_t end = PyLong_AsSsize_t(args[3]);
    if (PyErr_Occurred() || check_crc < 0) return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) return NULL;
    PyObject *result = decode_at(view.buf, pos, end > view.len ? view.len : end, check_crc, NULL);
    PyBuffer_Release(&view);
    return result;
}

/* The layout of the record at r, of which available bytes may be read: 0 if it is a
 * v1/v2 record whose lengths add up to its TOTALSIZE (record.decode_record's checks, the
 * CRC and PHYSICALOFFSET aside), -1 for anything else. */
static int record_layout(const unsigned char *r, int64_t available, Layout *l) {
    if (available < 8) return -1;
    l->total = (int32_t)be32(r);
    uint32_t magic = be32(r + 4);
    l->version = magic == MAGIC_V1 ? 1 : magic == MAGIC_V2 ? 2 : 0;
    int64_t minimum = l->version == 2 ? MINIMUM_SIZE_V2 : MINIMUM_SIZE_V1;
    if (l->version == 0 || l->total < minimum || l->total > available) return -1;
    l->sys_flag = (int32_t)be32(r + OFFSET_SYSFLAG);
    l->born_width = l->sys_flag & BORNHOST_V6 ? 16 : 4;
    l->store_width = l->sys_flag & STOREHOST_V6 ? 16 : 4;
    l->born = r + PREFIX_SIZE;
    l->store_ts = l->born + l->born_width + 4;
    l->store = l->store_ts + 8;
    l->reconsume = l->store + l->store_width + 4;
    int64_t head_size = (l->reconsume + 16) - r;
    if (head_size > l->total) return -1;
    l->body_length = (int32_t)be32(l->reconsume + 12);
    int64_t width = l->version; /* of the topic's length: 1 byte in v1, 2 in v2 */
    if (l->body_length < 0 || head_size + l->body_length + width > l->total) return -1;
    l->body = r + head_size;
    const unsigned char *cursor = l->body + l->body_length;
    l->topic_length = l->version == 1 ? (int8_t)cursor[0] : be16(cursor);
    cursor += width;
    if (l->topic_length < 0 || (cursor - r) + l->topic_length + 2 > l->total) return -1;
    l->topic = cursor;
    cursor += l->topic_length;
    l->properties_length = be16(cursor);
    l->properties = cursor + 2;
    if (l->properties_length < 0 || (l->properties - r) + l->properties_length > l->total) return -1;
    int64_t expected = minimum + (l->born_width == 16 ? 12 : 0) + (l->store_width == 16 ? 12 : 0) + l->body_length
        + l->topic_length + l->properties_length;
    return l->total == expected ? 0 : -1;
}

/* Whether the well-formed record r laid out as l is one match keeps (KeyMatch.__call__):
 * of the topic, stored within [begin_ms, end_ms], lying within [visible_begin,
 * visible_end), and with the key among the non-empty space-separated parts of its last KEYS pair.
 * Bytes stand for texts here: the topic is ASCII and the key's UTF-8 holds no U+FFFD
 * (KeyMatch.compiled), so a part decodes to the key exactly when its bytes are the key's. */
static int matches(const unsigned char *r, const Layout *l, const Match *match) {
    if (l->topic_length != match->topic_length || memcmp(l->topic, match->topic, match->topic_length) != 0) return 0;
    long long stored_ms = be64(l->store_ts), offset = be64(r + 28);
    if (stored_ms < match->begin_ms || stored_ms > match->end_ms) return 0;
    if (offset < match->visible_begin || offset + l->total > match->visible_end) return 0;
    const unsigned char *p = l->properties, *end = p + l->properties_length, *name, *value, *keys = NULL;
    Py_ssize_t name_length, value_length, keys_length = 0;
    while (next_property(&p, end, &name, &name_length, &value, &value_length))
        if (named_property(name, name_length) == 0) {
            keys = value;
            keys_length = value_length;
        }
    for (Py_ssize_t start = 0; keys != NULL && start < keys_length;) {
        const unsigned char *space = memchr(keys + start, ' ', keys_length - start);
        Py_ssize_t stop = space == NULL ? keys_length : space - keys;
        if (stop - start == match->key_length && stop > start && memcmp(keys + start, match->key, match->key_length) == 0)
            return 1;
        start = stop + 1;
    }
    return 0;
}

/* Bodies of at least this many bytes are checked and copied without the GIL: below it,
 * releasing and taking it back costs more than the work. */
#define BODY_UNLOCKED_BYTES_MIN (256 * 1024)

/* The record at buf[pos:], reading nothing at or past end: a Record, None for anything
 * else, False for a well-formed record match does not keep, NULL with an error set. */
static PyObject *decode_at(const unsigned char *buf, Py_ssize_t pos, Py_ssize_t end, int check_crc,
                           const Match *match) {
    PyObject *result = NULL;
    PyObject *fields[RECORD_FIELDS] = {NULL};
    Layout l;
    if (pos < 0 || end < 8 || pos > end - 8) goto slow;
    const unsigned char *r = buf + pos;
    if (record_layout(r, end - pos, &l) < 0) goto slow;
    int32_t stored_crc = (int32_t)be32(r + 8);

    /* A large body's CRC and copy run without the GIL (the caller holds the buffer, and
     * the new bytes object is no one else's yet), so a thread reading a 4 MiB record
     * does not hold up every other thread (the node's event loop) for its length. */
    int unlocked = l.body_length >= BODY_UNLOCKED_BYTES_MIN;
    uint32_t crc = 0;
    if (check_crc && l.body_length > 0) {
        if (unlocked) {
            Py_BEGIN_ALLOW_THREADS
            crc = crc32_of(l.body, l.body_length);
            Py_END_ALLOW_THREADS
        } else {
            crc = crc32_of(l.body, l.body_length);
        }
        if ((int32_t)(crc & 0x7FFFFFFF) != stored_crc) goto slow;
    }
    if (match != NULL && !matches(r, &l, match)) return Py_NewRef(Py_False);
    if (unlocked) {
        fields[1] = PyBytes_FromStringAndSize(NULL, l.body_length);
        if (fields[1] == NULL) goto done;
        char *into = PyBytes_AS_STRING(fields[1]);
        Py_BEGIN_ALLOW_THREADS
        memcpy(into, l.body, (size_t)l.body_length);
        Py_END_ALLOW_THREADS
    } else {
        fields[1] = PyBytes_FromStringAndSize((const char *)l.body, l.body_length);
        if (fields[1] == NULL) goto done;
    }
    fields[0] = topic_at(l.topic, l.topic_length);
    fields[2] = decode_properties(l.properties, l.properties_length);
    fields[3] = PyLong_FromLong((int32_t)be32(r + 12));                         /* queue_id */
    fields[4] = PyLong_FromLong((int32_t)be32(r + 16));                         /* flag */
    fields[5] = PyLong_FromLongLong(be64(r + 20));                              /* queue_offset */
    fields[6] = PyLong_FromLongLong(be64(r + 28));                              /* commitlog_offset */
    fields[7] = PyLong_FromLong(l.sys_flag);
    fields[8] = PyLong_FromLongLong(be64(r + 40));                              /* born_timestamp_ms */
    fields[9] = host_at(&born_cache, l.born, l.born_width);
    fields[10] = PyLong_FromLongLong(be64(l.store_ts));
    fields[11] = host_at(&store_cache, l.store, l.store_width);
    fields[12] = PyLong_FromLong((int32_t)be32(l.reconsume));                   /* reconsume_times */
    fields[13] = PyLong_FromLongLong(be64(l.reconsume + 4));                    /* prepared_transaction_offset */
    fields[14] = PyLong_FromLong(stored_crc);
    fields[15] = PyLong_FromLongLong(l.total);
    fields[16] = PyLong_FromLong(l.version);
    for (int i = 0; i < RECORD_FIELDS; i++)
        if (fields[i] == NULL) goto done;
    return new_record(fields);
slow:
    result = Py_NewRef(Py_None);
done:
    for (int i = 0; i < RECORD_FIELDS; i++) Py_XDECREF(fields[i]);
    return result;
}

/* read_records(fd, positions, file_size, start_offset, read_ahead, check_crc, match)
 *     -> list[Record | None | False]
 *
 * CommitLog._read_through_file for each position of one commit log file (fd, of
 * file_size bytes, starting at commit log offset start_offset): read_ahead bytes with
 * pread, the rest of a longer record with a second one, then decode_record. None where
 * that finds anything but a well-formed record whose PHYSICALOFFSET is its own offset
 * (the caller reads that one through the Python path, which says what is there). match
 * is None or KeyMatch.compiled()'s (topic, key, begin_ms, end_ms, visible_begin,
 * visible_end): a well-formed record it does not keep is False, and no Record is built. */
PyObject *read_records(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 7 || !PyList_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError,
                        "read_records takes (fd, positions: list, file_size, start_offset, read_ahead, check_crc, match)");
        return NULL;
    }
    Match match_at, *match = NULL;
    if (args[6] != Py_None) {
        match = &match_at;
        if (!PyTuple_Check(args[6])) {
            PyErr_SetString(PyExc_TypeError, "read_records: match is None or a tuple");
            return NULL;
        }
        if (!PyArg_ParseTuple(args[6], "y#y#LLLL;read_records: match is (topic, key, begin_ms, end_ms, "
                                       "visible_begin, visible_end)",
                              &match->topic, &match->topic_length, &match->key, &match->key_length,
                              &match->begin_ms, &match->end_ms, &match->visible_begin, &match->visible_end))
            return NULL;
    }
    if (record_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "_speedups.configure was not called");
        return NULL;
    }
    long fd = PyLong_AsLong(args[0]);
    long long file_size = PyLong_AsLongLong(args[2]);
    long long start_offset = PyLong_AsLongLong(args[3]);
    Py_ssize_t read_ahead = PyLong_AsSsize_t(args[4]);
    int check_crc = PyObject_IsTrue(args[5]);
    if (PyErr_Occurred() || check_crc < 0) return NULL;
    if (fd < INT_MIN || fd > INT_MAX) {
        PyErr_SetString(PyExc_OverflowError, "read_records: fd is outside int");
        return NULL;
    }
    if (read_ahead < 8) {
        PyErr_SetString(PyExc_ValueError, "read_records: read_ahead is at least 8 bytes");
        return NULL;
    }
    Py_ssize_t count = PyList_GET_SIZE(args[1]);
    PyObject *result = PyList_New(count);
    if (result == NULL) return NULL;
    Py_ssize_t capacity = read_ahead;
    unsigned char *buffer = PyMem_Malloc(capacity);
    if (buffer == NULL) {
        Py_DECREF(result);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        long long position = PyLong_AsLongLong(PyList_GET_ITEM(args[1], i));
        if (position == -1 && PyErr_Occurred()) goto failed;
        PyObject *record = NULL;
        if (position < 0 || position >= file_size) goto none;
        long long wanted = file_size - position < read_ahead ? file_size - position : read_ahead;
        ssize_t got = pread((int)fd, buffer, (size_t)wanted, (off_t)position);
        if (got < 8) goto none;
        long long size = (int32_t)be32(buffer);
        if (size > got && size <= READ_THROUGH_RECORD_BYTES_MAX && position + size <= file_size) {
            if (size > capacity) {
                unsigned char *larger = PyMem_Realloc(buffer, (size_t)size);
                if (larger == NULL) {
                    PyErr_NoMemory();
                    goto failed;
                }
                buffer = larger;
                capacity = size;
            }
            while (got < size) {
                ssize_t more = pread((int)fd, buffer + got, (size_t)(size - got), (off_t)(position + got));
                if (more <= 0) goto none;
                got += more;
            }
        }
        if (got < 36 || (uint64_t)be64(buffer + 28) != (uint64_t)start_offset + (uint64_t)position) goto none;
        record = decode_at(buffer, 0, got, check_crc, match);
        if (record == NULL) goto failed;
        PyList_SET_ITEM(result, i, record);
        continue;
    none:
        PyList_SET_ITEM(result, i, Py_NewRef(Py_None));
    }
    PyMem_Free(buffer);
    return result;
failed:
    PyMem_Free(buffer);
    Py_DECREF(result);
    return NULL;
}

/* ---- Encoding a batch --------------------------------------------------------------- */

/* A SocketAddress's address bytes (borrowed into *ip) and port; -1 with an error set. */
static int host_fields(PyObject *host, PyObject **ip, long *port) {
    PyObject *address = PyObject_GetAttrString(host, "ip");
    if (address == NULL) return -1;
    PyObject *port_object = PyObject_GetAttrString(host, "port");
    if (port_object == NULL) {
        Py_DECREF(address);
        return -1;
    }
    *port = PyLong_AsLong(port_object);
    Py_DECREF(port_object);
    if (!PyBytes_Check(address) || (PyBytes_GET_SIZE(address) != 4 && PyBytes_GET_SIZE(address) != 16)) {
        Py_DECREF(address);
        PyErr_SetString(PyExc_ValueError, "a host address is 4 or 16 bytes");
        return -1;
    }
    *ip = address; /* a new reference: the caller releases it */
    return *port == -1 && PyErr_Occurred() ? -1 : 0;
}

static inline unsigned char *put_host(unsigned char *p, PyObject *ip, long port) {
    Py_ssize_t width = PyBytes_GET_SIZE(ip);
    memcpy(p, PyBytes_AS_STRING(ip), width);
    put_be32(p + width, (uint32_t)port);
    return p + width + 4;
}

/* encode_records(first_offset, queue_ids, flags, queue_offsets, born_timestamps_ms,
 *                born_hosts, bodies, topics, properties, store_timestamp_ms, store_host,
 *                now_ms) -> (bytes, sizes)
 *
 * The v1 records of a batch (record.encode_record's bytes: MessageExtEncoder), joined,
 * laid out one after another from first_offset (their PHYSICALOFFSETs), and each one's
 * size. A born timestamp of 0 becomes now_ms. Topics are str, bodies and properties
 * bytes; the caller has validated their lengths (a topic ≤ 127 UTF-8 bytes, properties
 * ≤ 32767). */
PyObject *encode_records(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (!arity(nargs, 12, "encode_records takes 12 arguments")) return NULL;
    long long first_offset = PyLong_AsLongLong(args[0]);
    long long store_timestamp = PyLong_AsLongLong(args[9]);
    long long now = PyLong_AsLongLong(args[11]);
    if (PyErr_Occurred()) return NULL;
    PyObject *columns[8];
    for (int i = 0; i < 8; i++) {
        columns[i] = args[i + 1];
        if (!PyList_Check(columns[i])) {
            PyErr_SetString(PyExc_TypeError, "encode_records takes its columns as lists");
            return NULL;
        }
    }
    PyObject *queue_ids = columns[0], *flags = columns[1], *queue_offsets = columns[2], *born_timestamps = columns[3],
             *born_hosts = columns[4], *bodies = columns[5], *topics = columns[6], *properties = columns[7];
    Py_ssize_t count = PyList_GET_SIZE(bodies);
    for (int i = 0; i < 8; i++) {
        if (PyList_GET_SIZE(columns[i]) != count) {
            PyErr_SetString(PyExc_ValueError, "encode_records: columns of different lengths");
            return NULL;
        }
    }
    PyObject *store_ip = NULL, *born_ip = NULL, *born_host = NULL;
    long store_port = 0, born_port = 0;
    PyObject *sizes = NULL, *joined = NULL, *result = NULL;
    if (host_fields(args[10], &store_ip, &store_port) < 0) goto done;
    int store_v6 = PyBytes_GET_SIZE(store_ip) == 16;
    sizes = PyList_New(count);
    if (sizes == NULL) goto done;

    /* Sizes first: the one allocation for the whole batch. */
    Py_ssize_t total = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *body = PyList_GET_ITEM(bodies, i), *topic = PyList_GET_ITEM(topics, i),
                 *property_bytes = PyList_GET_ITEM(properties, i), *host = PyList_GET_ITEM(born_hosts, i);
        Py_ssize_t topic_length;
        if (!PyBytes_Check(body) || !PyBytes_Check(property_bytes)) {
            PyErr_SetString(PyExc_TypeError, "bodies and properties are bytes");
            goto done;
        }
        if (PyUnicode_AsUTF8AndSize(topic, &topic_length) == NULL) goto done;
        if (topic_length > 127 || PyBytes_GET_SIZE(property_bytes) > 32767) {
            PyErr_SetString(PyExc_ValueError, "a topic is at most 127 bytes and properties at most 32767");
            goto done;
        }
        if (host != born_host) { /* consecutive messages mostly share one SocketAddress */
            Py_CLEAR(born_ip);
            if (host_fields(host, &born_ip, &born_port) < 0) goto done;
            born_host = host;
        }
        Py_ssize_t size = 75 + (PyBytes_GET_SIZE(born_ip) == 16 ? 20 : 8) + (store_v6 ? 20 : 8)
            + PyBytes_GET_SIZE(body) + topic_length + PyBytes_GET_SIZE(property_bytes);
        PyObject *size_object = PyLong_FromSsize_t(size);
        if (size_object == NULL) goto done;
        PyList_SET_ITEM(sizes, i, size_object);
        total += size;
    }
    joined = PyBytes_FromStringAndSize(NULL, total);
    if (joined == NULL) goto done;
    unsigned char *p = (unsigned char *)PyBytes_AS_STRING(joined);
    long long offset = first_offset;
    born_host = NULL;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *body = PyList_GET_ITEM(bodies, i), *property_bytes = PyList_GET_ITEM(properties, i),
                 *host = PyList_GET_ITEM(born_hosts, i);
        if (host != born_host) {
            Py_CLEAR(born_ip);
            if (host_fields(host, &born_ip, &born_port) < 0) goto done;
            born_host = host;
        }
        Py_ssize_t topic_length, body_length = PyBytes_GET_SIZE(body);
        const char *topic = PyUnicode_AsUTF8AndSize(PyList_GET_ITEM(topics, i), &topic_length);
        long long size = PyLong_AsLongLong(PyList_GET_ITEM(sizes, i));
        long queue_id = PyLong_AsLong(PyList_GET_ITEM(queue_ids, i));
        long flag = PyLong_AsLong(PyList_GET_ITEM(flags, i));
        long long queue_offset = PyLong_AsLongLong(PyList_GET_ITEM(queue_offsets, i));
        PyObject *born_timestamp_object = PyList_GET_ITEM(born_timestamps, i);
        long long born_timestamp = born_timestamp_object == Py_None ? 0 : PyLong_AsLongLong(born_timestamp_object);
        if (PyErr_Occurred()) goto done;
        if (queue_id < INT32_MIN || queue_id > INT32_MAX || flag < INT32_MIN || flag > INT32_MAX) {
            PyErr_SetString(PyExc_OverflowError, "a queue id or flag is outside int32");
            goto done;
        }
        uint32_t crc = 0;
        if (body_length > 0) /* UtilAll.crc32: zlib's CRC-32 & 0x7FFFFFFF, 0 for no body */
            crc = crc32_of((const unsigned char *)PyBytes_AS_STRING(body), body_length) & 0x7FFFFFFF;
        int born_v6 = PyBytes_GET_SIZE(born_ip) == 16;
        put_be32(p, (uint32_t)size);
        put_be32(p + 4, MAGIC_V1);
        put_be32(p + 8, crc);
        put_be32(p + 12, (uint32_t)queue_id);
        put_be32(p + 16, (uint32_t)flag);
        put_be64(p + 20, (uint64_t)queue_offset);
        put_be64(p + 28, (uint64_t)offset);
        put_be32(p + 36, (born_v6 ? BORNHOST_V6 : 0) | (store_v6 ? STOREHOST_V6 : 0));
        put_be64(p + 40, (uint64_t)(born_timestamp ? born_timestamp : now));
        unsigned char *q = put_host(p + PREFIX_SIZE, born_ip, born_port);
        put_be64(q, (uint64_t)store_timestamp);
        q = put_host(q + 8, store_ip, store_port);
        put_be32(q, 0);      /* RECONSUMETIMES */
        put_be64(q + 4, 0);  /* PREPAREDTRANSACTIONOFFSET */
        put_be32(q + 12, (uint32_t)body_length);
        q += 16;
        memcpy(q, PyBytes_AS_STRING(body), body_length);
        q += body_length;
        *q++ = (unsigned char)topic_length;
        memcpy(q, topic, topic_length);
        q += topic_length;
        Py_ssize_t properties_length = PyBytes_GET_SIZE(property_bytes);
        q[0] = (unsigned char)(properties_length >> 8);
        q[1] = (unsigned char)properties_length;
        memcpy(q + 2, PyBytes_AS_STRING(property_bytes), properties_length);
        q += 2 + properties_length;
        if (q - p != size) {
            PyErr_SetString(PyExc_AssertionError, "encode_records: a record's bytes differ from its size");
            goto done;
        }
        p = q;
        offset += size;
    }
    result = PyTuple_Pack(2, joined, sizes);
done:
    Py_XDECREF(store_ip);
    Py_XDECREF(born_ip);
    Py_XDECREF(sizes);
    Py_XDECREF(joined);
    return result;
}
