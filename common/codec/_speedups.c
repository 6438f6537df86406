/*
 * Compiled fast paths of the codecs (rmqstore.common.codec._speedups).
 *
 * Each function here is the hot loop of a Python function that stays the definition:
 *
 *   java_string_hash, index_key_hash   javahash.java_string_hash / index_key_hash
 *   matching_offsets                   files.index.IndexFile.matching_offsets
 *   decode_record                      record.decode_record
 *   read_records                       commitlog.CommitLog._read_through_file, for many offsets
 *   first_stored_after                 files.consumequeue.ConsumeQueue.offset_by_time's bisection
 *   encode_records                     record.encode_record over a writer's batch
 *   encode_common_properties           properties.encode_messages_properties (KEYS, TAGS, UNIQ_KEY)
 *   walk_starts, body_crcs             columnar.walk's loop, the bodies' CRCs of columnar.decode
 *   property_pairs                     columnar's split of the properties into pairs
 *   arrow_columns                      columnar.decode and pipeline.columns.arrow_batch in one pass
 *   span_texts, span_key_hashes        dispatch.DispatchBatch.of_columns: topics, tags, index key hashes
 *   tags_codes, message_key_hashes     dispatch.DispatchBatch.of_messages: tags codes, index key hashes
 *   index_put_keys                     files.index.IndexFile.put_keys
 *   screen_batch                       writer.validate._plainly_valid
 *   jsonl_send_batches                 cli.bulk_send's parse, screen and encode of a JSON Lines file
 *   send_batch_columns                 writer.service.to_batch, from a SendBatchRequest's bytes
 *   queue_unit_blocks                  consumequeue.queue_unit_blocks
 *   compact_response_bytes             writer.service.compact_response, serialized
 *
 * The fast paths only ever succeed. Where the bytes are anything but a well-formed
 * record or chain (a BLANK filler, zeros, a bad size or CRC, a read past the buffer), they
 * return None and the caller runs the Python function, which decides what the bytes are
 * and raises its exact errors. So every error path and message is written once, in
 * Python, and tests compare both paths on the same bytes (tests/test_speedups.py).
 *
 * Layouts: docs/format.md §3 (records) and §7 (index files), declared with their offsets in
 * record.py and index.py; all integers big-endian.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

/* record.py */
#define MAGIC_V1 0xDAA320A7u
#define MAGIC_V2 0xDAA320ABu
#define OFFSET_SYSFLAG 36
#define PREFIX_SIZE 48 /* TOTALSIZE … BORNTIMESTAMP */
#define BORNHOST_V6 0x10
#define STOREHOST_V6 0x20
/* calMsgLength with IPv4 hosts and nothing variable: 74 + L + 8 + 8 */
#define MINIMUM_SIZE_V1 91
#define MINIMUM_SIZE_V2 92
/* commitlog.py: READ_THROUGH_FILE_RECORD_BYTES_MAX */
#define READ_THROUGH_RECORD_BYTES_MAX (16 * 1024 * 1024)

/* index.py */
#define INDEX_HEADER_SIZE 40
#define INDEX_OFFSET_INDEX_COUNT 36
#define INDEX_SLOT_SIZE 4
#define INDEX_ENTRY_SIZE 20

static inline uint32_t be32(const unsigned char *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

static inline int64_t be64(const unsigned char *p) { return (int64_t)((uint64_t)be32(p) << 32 | be32(p + 4)); }

static inline int16_t be16(const unsigned char *p) { return (int16_t)((uint16_t)p[0] << 8 | (uint16_t)p[1]); }

/* ---- String.hashCode ---------------------------------------------------------------- */

/* h = 31*h + unit over the UTF-16 code units of text (mod 2^32), continuing from h. */
static uint32_t hash_units(uint32_t h, PyObject *text) {
    int kind = PyUnicode_KIND(text);
    const void *data = PyUnicode_DATA(text);
    Py_ssize_t length = PyUnicode_GET_LENGTH(text);
    if (kind == PyUnicode_1BYTE_KIND) {
        const Py_UCS1 *units = data;
        for (Py_ssize_t i = 0; i < length; i++) h = 31 * h + units[i];
        return h;
    }
    for (Py_ssize_t i = 0; i < length; i++) {
        Py_UCS4 cp = PyUnicode_READ(kind, data, i);
        if (cp > 0xFFFF) { /* a surrogate pair, as Java stores it */
            cp -= 0x10000;
            h = 31 * h + (0xD800 + (cp >> 10));
            h = 31 * h + (0xDC00 + (cp & 0x3FF));
        } else {
            h = 31 * h + cp;
        }
    }
    return h;
}

static PyObject *java_string_hash(PyObject *module, PyObject *text) {
    if (!PyUnicode_Check(text)) {
        PyErr_SetString(PyExc_TypeError, "java_string_hash takes a str");
        return NULL;
    }
    return PyLong_FromLong((int32_t)hash_units(0, text));
}

/* IndexFile.indexKeyHashMethod of "topic#key": |hashCode|, Integer.MIN_VALUE as 0. */
static PyObject *index_key_hash(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyUnicode_Check(args[0]) || !PyUnicode_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "index_key_hash takes (topic: str, key: str)");
        return NULL;
    }
    uint32_t h = hash_units(0, args[0]);
    h = 31 * h + '#';
    h = hash_units(h, args[1]);
    int32_t signed_h = (int32_t)h;
    long result = signed_h == INT32_MIN ? 0 : (signed_h < 0 ? -(long)signed_h : signed_h);
    return PyLong_FromLong(result);
}

/* ---- Index chains ------------------------------------------------------------------- */

/* matching_offsets(buf, slots, entries, key_hash, number, steps, max_count)
 *     -> (offsets, number, steps) | None
 *
 * The phyOffsets along the key's slot chain whose hash is key_hash, newest first, with
 * Apache's stop rules, at most max_count of them per call: number 0 starts at the slot;
 * the number and steps returned resume the walk (number 0: the chain ended). None if
 * the chain leads outside the buffer. */
static PyObject *matching_offsets(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError,
                        "matching_offsets takes (buf, slots, entries, key_hash, number, steps, max_count)");
        return NULL;
    }
    long long slots = PyLong_AsLongLong(args[1]);
    long long entries = PyLong_AsLongLong(args[2]);
    long long key_hash = PyLong_AsLongLong(args[3]);
    long long number = PyLong_AsLongLong(args[4]);
    long long steps = PyLong_AsLongLong(args[5]);
    Py_ssize_t max_count = PyLong_AsSsize_t(args[6]);
    if (PyErr_Occurred()) return NULL;
    if (slots <= 0 || key_hash < 0 || number < 0 || steps < 0 || max_count < 1) Py_RETURN_NONE;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) return NULL;
    const unsigned char *buf = view.buf;
    Py_ssize_t length = view.len;
    PyObject *found = NULL, *result = NULL;
    long long slot_at = INDEX_HEADER_SIZE + (key_hash % slots) * INDEX_SLOT_SIZE;
    long long entries_at = INDEX_HEADER_SIZE + slots * INDEX_SLOT_SIZE;
    if (slot_at + INDEX_SLOT_SIZE > length) goto slow;
    int32_t count = (int32_t)be32(buf + INDEX_OFFSET_INDEX_COUNT);
    if (count < 1) count = 1;
    found = PyList_New(0);
    if (found == NULL) goto done;
    if (number == 0) {
        number = (int32_t)be32(buf + slot_at);
        if (number <= 0 || number > count || count <= 1) {
            number = 0;
            goto finished;
        }
    }
    for (; steps < count; steps++) {
        if (number >= entries) {
            number = 0;
            goto finished;
        }
        if (PyList_GET_SIZE(found) >= max_count) goto finished; /* resume at this entry */
        long long at = entries_at + number * INDEX_ENTRY_SIZE;
        if (at + INDEX_ENTRY_SIZE > length) goto slow;
        const unsigned char *entry = buf + at;
        if ((int32_t)be32(entry) == key_hash) {
            PyObject *offset = PyLong_FromLongLong(be64(entry + 4));
            if (offset == NULL || PyList_Append(found, offset) < 0) {
                Py_XDECREF(offset);
                goto done;
            }
            Py_DECREF(offset);
        }
        int32_t prev = (int32_t)be32(entry + 16);
        if (prev <= 0 || prev > count || prev == number) {
            number = 0;
            steps++;
            goto finished;
        }
        number = prev;
    }
    number = 0;
finished:
    result = Py_BuildValue("(OLL)", found, number, steps);
    goto done;
slow:
    result = Py_NewRef(Py_None);
done:
    Py_XDECREF(found);
    PyBuffer_Release(&view);
    return result;
}

/* ---- Records ------------------------------------------------------------------------ */

/* Set once by record.py: the Record class and the (cached) SocketAddress factory. */
static PyObject *record_type = NULL;
static PyObject *address_factory = NULL;
/* zlib's CRC-32 of p[0:n] (defined with the bulk checks below). */
static uint32_t crc32_of(const unsigned char *p, Py_ssize_t n);
/* The property names nearly every record has, shared instead of decoded each time. */
static PyObject *name_keys = NULL, *name_tags = NULL, *name_uniq_key = NULL;

/* The last host seen in each role: records name few distinct hosts. */
typedef struct {
    unsigned char raw[20];
    Py_ssize_t width;
    PyObject *address;
} HostCache;
static HostCache born_cache, store_cache;

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

static PyObject *configure(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
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

/* properties.decode_properties' next pair in [*p, end): segments split on 0x02, each cut
 * at its first 0x01, a segment with an empty name or value holding none. 1 with the
 * pair's name and value (and *p past its segment); 0 when no pair is left. */
static inline int next_property(const unsigned char **p, const unsigned char *end, const unsigned char **name,
                                Py_ssize_t *name_length, const unsigned char **value, Py_ssize_t *value_length) {
    while (*p < end) {
        const unsigned char *start = *p;
        const unsigned char *cut_at = memchr(start, 0x02, end - start);
        const unsigned char *segment_end = cut_at == NULL ? end : cut_at;
        const unsigned char *split = memchr(start, 0x01, segment_end - start);
        *p = cut_at == NULL ? end : cut_at + 1;
        if (split != NULL && split > start && split < segment_end - 1) {
            *name = start;
            *name_length = split - start;
            *value = split + 1;
            *value_length = segment_end - split - 1;
            return 1;
        }
    }
    return 0;
}

/* Which of the properties the columns single out a name is: 0 KEYS, 1 TAGS, 2 UNIQ_KEY,
 * -1 any other. */
static inline int named_property(const unsigned char *p, Py_ssize_t n) {
    if (n == 4 && memcmp(p, "KEYS", 4) == 0) return 0;
    if (n == 4 && memcmp(p, "TAGS", 4) == 0) return 1;
    if (n == 8 && memcmp(p, "UNIQ_KEY", 8) == 0) return 2;
    return -1;
}

static PyObject *property_name(const unsigned char *p, Py_ssize_t n) {
    PyObject *shared[3] = {name_keys, name_tags, name_uniq_key};
    int named = named_property(p, n);
    if (named >= 0) return Py_NewRef(shared[named]);
    return PyUnicode_DecodeUTF8((const char *)p, n, "replace");
}

/* properties.decode_properties: segments split on 0x02, each cut at its first 0x01;
 * empty names or values dropped, a later duplicate wins. Splitting the bytes before
 * decoding gives the same texts as decoding first: 0x01 and 0x02 are ASCII, never part
 * of a UTF-8 sequence, so the "replace" decoder resynchronises on them either way. */
static PyObject *decode_properties(const unsigned char *p, Py_ssize_t n) {
    PyObject *result = PyDict_New();
    if (result == NULL) return NULL;
    const unsigned char *end = p + n, *name_at, *value_at;
    Py_ssize_t name_length, value_length;
    while (next_property(&p, end, &name_at, &name_length, &value_at, &value_length)) {
        PyObject *name = property_name(name_at, name_length);
        PyObject *value = name == NULL ? NULL : PyUnicode_DecodeUTF8((const char *)value_at, value_length, "replace");
        if (value == NULL || PyDict_SetItem(result, name, value) < 0) {
            Py_XDECREF(name);
            Py_XDECREF(value);
            Py_DECREF(result);
            return NULL;
        }
        Py_DECREF(name);
        Py_DECREF(value);
    }
    return result;
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

static PyObject *decode_record(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "decode_record takes (buf, pos, check_crc, end)");
        return NULL;
    }
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

/* Where the fields of a v1/v2 record lie (docs/format.md §3). */
typedef struct {
    int version;
    int64_t total;
    int32_t sys_flag;
    Py_ssize_t born_width, store_width;
    const unsigned char *born, *store_ts, *store, *reconsume, *body, *topic, *properties;
    int64_t body_length, topic_length, properties_length;
} Layout;

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

/* The record at buf[pos:], reading nothing at or past end: a Record, None for anything
 * else, False for a well-formed record match does not keep, NULL with an error set. */
static PyObject *decode_at(const unsigned char *buf, Py_ssize_t pos, Py_ssize_t end, int check_crc,
                           const Match *match) {
    PyObject *result = NULL;
    PyObject *fields[RECORD_FIELDS] = {NULL};
    Layout l;
    if (pos < 0 || pos > end - 8) goto slow;
    const unsigned char *r = buf + pos;
    if (record_layout(r, end - pos, &l) < 0) goto slow;
    int32_t stored_crc = (int32_t)be32(r + 8);

    if (check_crc && l.body_length > 0 && (int32_t)(crc32_of(l.body, l.body_length) & 0x7FFFFFFF) != stored_crc)
        goto slow;
    if (match != NULL && !matches(r, &l, match)) return Py_NewRef(Py_False);
    fields[1] = PyBytes_FromStringAndSize((const char *)l.body, l.body_length);
    if (fields[1] == NULL) goto done;
    fields[0] = PyUnicode_DecodeUTF8((const char *)l.topic, l.topic_length, "replace");
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
static PyObject *read_records(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 7 || !PyList_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError,
                        "read_records takes (fd, positions: list, file_size, start_offset, read_ahead, check_crc, match)");
        return NULL;
    }
    Match match_at, *match = NULL;
    if (args[6] != Py_None) {
        match = &match_at;
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
    int fd = PyLong_AsLong(args[0]);
    long long file_size = PyLong_AsLongLong(args[2]);
    long long start_offset = PyLong_AsLongLong(args[3]);
    Py_ssize_t read_ahead = PyLong_AsSsize_t(args[4]);
    int check_crc = PyObject_IsTrue(args[5]);
    if (PyErr_Occurred() || check_crc < 0) return NULL;
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
        ssize_t got = pread(fd, buffer, (size_t)wanted, (off_t)position);
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
                ssize_t more = pread(fd, buffer + got, (size_t)(size - got), (off_t)(position + got));
                if (more <= 0) goto none;
                got += more;
            }
        }
        if (got < 36 || be64(buffer + 28) != start_offset + position) goto none;
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

/* ---- Time search ------------------------------------------------------------------- */

#define STORE_TIME_HEADER_MAX (PREFIX_SIZE + 20 + 8) /* … BORNHOST (IPv6 at most), STORETIMESTAMP */
#define CQ_UNIT_SIZE 20
#define CQ_FILLER_SIZE 0x7FFFFFFFu

/* first_stored_after(units, lo, hi, timestamp, strict, fd, file_start, file_size) -> int | None
 *
 * ConsumeQueue.offset_by_time's bisection over units [lo, hi) of one consume queue file's
 * bytes: the first unit whose record was stored at or after timestamp (after it when
 * strict), hi if none. Each probe reads the record's header with pread from the one commit
 * log file that holds the records of all these units (its descriptor, first offset and
 * size) and takes STORETIMESTAMP as record.store_timestamp_at does. None when a probed
 * unit is a filler, points outside that file or at no record header: the caller's Python
 * bisection then reads that unit and says what is wrong. */
static PyObject *first_stored_after(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError,
                        "first_stored_after takes (units, lo, hi, timestamp, strict, fd, file_start, file_size)");
        return NULL;
    }
    long long low = PyLong_AsLongLong(args[1]);
    long long high = PyLong_AsLongLong(args[2]);
    long long timestamp = PyLong_AsLongLong(args[3]);
    int strict = PyObject_IsTrue(args[4]);
    int fd = PyLong_AsLong(args[5]);
    long long file_start = PyLong_AsLongLong(args[6]);
    long long file_size = PyLong_AsLongLong(args[7]);
    if (PyErr_Occurred() || strict < 0) return NULL;
    Py_buffer units;
    if (PyObject_GetBuffer(args[0], &units, PyBUF_SIMPLE) < 0) return NULL;
    PyObject *result = NULL;
    if (low < 0 || high < low || high * CQ_UNIT_SIZE > units.len) {
        PyErr_SetString(PyExc_ValueError, "first_stored_after: the range is outside the units");
        goto done;
    }
    const unsigned char *base = units.buf;
    unsigned char header[STORE_TIME_HEADER_MAX];
    while (low < high) {
        long long mid = low + (high - low) / 2;
        const unsigned char *unit = base + mid * CQ_UNIT_SIZE;
        if (be32(unit + 8) == CQ_FILLER_SIZE) goto slow; /* a filler, or a torn unit */
        long long position = be64(unit) - file_start;
        if (position < 0 || position >= file_size) goto slow;
        long long wanted = file_size - position < STORE_TIME_HEADER_MAX ? file_size - position : STORE_TIME_HEADER_MAX;
        ssize_t got = pread(fd, header, (size_t)wanted, (off_t)position);
        if (got < OFFSET_SYSFLAG + 4) goto slow;
        long long size = (int32_t)be32(header);
        uint32_t magic = be32(header + 4);
        if (magic != MAGIC_V1 && magic != MAGIC_V2) goto slow;
        long long at = PREFIX_SIZE + ((be32(header + OFFSET_SYSFLAG) & BORNHOST_V6) ? 20 : 8);
        if (at + 8 > size || at + 8 > got) goto slow;
        int64_t stored = be64(header + at);
        if (strict ? stored > timestamp : stored >= timestamp)
            high = mid;
        else
            low = mid + 1;
    }
    result = PyLong_FromLongLong(low);
    goto done;
slow:
    result = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&units);
    return result;
}

/* ---- Encoding a batch --------------------------------------------------------------- */

static inline void put32(unsigned char *p, uint32_t v) {
    p[0] = v >> 24;
    p[1] = v >> 16;
    p[2] = v >> 8;
    p[3] = v;
}

static inline void put64(unsigned char *p, uint64_t v) {
    put32(p, v >> 32);
    put32(p + 4, (uint32_t)v);
}

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
    put32(p + width, (uint32_t)port);
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
static PyObject *encode_records(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 12) {
        PyErr_SetString(PyExc_TypeError, "encode_records takes 12 arguments");
        return NULL;
    }
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
        put32(p, (uint32_t)size);
        put32(p + 4, MAGIC_V1);
        put32(p + 8, crc);
        put32(p + 12, (uint32_t)queue_id);
        put32(p + 16, (uint32_t)flag);
        put64(p + 20, (uint64_t)queue_offset);
        put64(p + 28, (uint64_t)offset);
        put32(p + 36, (born_v6 ? BORNHOST_V6 : 0) | (store_v6 ? STOREHOST_V6 : 0));
        put64(p + 40, (uint64_t)(born_timestamp ? born_timestamp : now));
        unsigned char *q = put_host(p + PREFIX_SIZE, born_ip, born_port);
        put64(q, (uint64_t)store_timestamp);
        q = put_host(q + 8, store_ip, store_port);
        put32(q, 0);      /* RECONSUMETIMES */
        put64(q + 4, 0);  /* PREPAREDTRANSACTIONOFFSET */
        put32(q + 12, (uint32_t)body_length);
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

/* encode_common_properties(order, keys, tags, uniq_keys[, pieces]) -> list[bytes]
 *
 * properties.encode_messages_properties for messages with KEYS (a list of str, joined
 * with spaces), TAGS and UNIQ_KEY: "name 0x01 value" joined by 0x02, the names in broker
 * order, given as positions in (KEYS, TAGS, UNIQ_KEY). Without pieces the message has
 * no properties of its own; with pieces (four bytes) it has the same ones as every other
 * message, and each message is pieces[0] value pieces[1] value pieces[2] value pieces[3],
 * the values in that order (the pieces hold every name, separator and shared value). */
static PyObject *encode_common_properties(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    static const char *names[3] = {"KEYS", "TAGS", "UNIQ_KEY"};
    static const Py_ssize_t name_lengths[3] = {4, 4, 8};
    if ((nargs != 4 && nargs != 5) || !PyTuple_Check(args[0]) || PyTuple_GET_SIZE(args[0]) != 3 || !PyList_Check(args[1])
        || !PyList_Check(args[2]) || !PyList_Check(args[3])
        || (nargs == 5 && (!PyTuple_Check(args[4]) || PyTuple_GET_SIZE(args[4]) != 4))) {
        PyErr_SetString(PyExc_TypeError, "encode_common_properties takes (order, keys, tags, uniq_keys[, pieces])");
        return NULL;
    }
    int order[3];
    for (int i = 0; i < 3; i++) {
        order[i] = (int)PyLong_AsLong(PyTuple_GET_ITEM(args[0], i));
        if (order[i] < 0 || order[i] > 2) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "order holds positions 0, 1 and 2");
            return NULL;
        }
    }
    /* The bytes around the values: given, or the names in order with their separators. */
    char named[3][16];
    const char *pieces[4];
    Py_ssize_t piece_lengths[4];
    if (nargs == 5) {
        for (int n = 0; n < 4; n++) {
            PyObject *piece = PyTuple_GET_ITEM(args[4], n);
            if (!PyBytes_Check(piece)) {
                PyErr_SetString(PyExc_TypeError, "encode_common_properties: pieces are bytes");
                return NULL;
            }
            pieces[n] = PyBytes_AS_STRING(piece);
            piece_lengths[n] = PyBytes_GET_SIZE(piece);
        }
    } else {
        for (int n = 0; n < 3; n++) {
            char *q = named[n];
            if (n > 0) *q++ = 0x02;
            memcpy(q, names[order[n]], name_lengths[order[n]]);
            q += name_lengths[order[n]];
            *q++ = 0x01;
            pieces[n] = named[n];
            piece_lengths[n] = q - named[n];
        }
        pieces[3] = "";
        piece_lengths[3] = 0;
    }
    PyObject *keys = args[1], *tags = args[2], *uniq_keys = args[3];
    Py_ssize_t count = PyList_GET_SIZE(keys);
    if (PyList_GET_SIZE(tags) != count || PyList_GET_SIZE(uniq_keys) != count) {
        PyErr_SetString(PyExc_ValueError, "encode_common_properties: columns of different lengths");
        return NULL;
    }
    Py_ssize_t pieces_length = piece_lengths[0] + piece_lengths[1] + piece_lengths[2] + piece_lengths[3];
    PyObject *result = PyList_New(count);
    if (result == NULL) return NULL;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *key_list = PySequence_Fast(PyList_GET_ITEM(keys, i), "KEYS is a sequence of str");
        if (key_list == NULL) goto fail;
        Py_ssize_t key_count = PySequence_Fast_GET_SIZE(key_list);
        const char *values[3];
        Py_ssize_t lengths[3];
        lengths[0] = key_count > 0 ? key_count - 1 : 0; /* the spaces */
        for (Py_ssize_t k = 0; k < key_count; k++) {
            Py_ssize_t length;
            if (PyUnicode_AsUTF8AndSize(PySequence_Fast_GET_ITEM(key_list, k), &length) == NULL) {
                Py_DECREF(key_list);
                goto fail;
            }
            lengths[0] += length;
        }
        values[1] = PyUnicode_AsUTF8AndSize(PyList_GET_ITEM(tags, i), &lengths[1]);
        values[2] = values[1] == NULL ? NULL : PyUnicode_AsUTF8AndSize(PyList_GET_ITEM(uniq_keys, i), &lengths[2]);
        if (values[2] == NULL) {
            Py_DECREF(key_list);
            goto fail;
        }
        Py_ssize_t total = pieces_length + lengths[0] + lengths[1] + lengths[2];
        PyObject *encoded = PyBytes_FromStringAndSize(NULL, total);
        if (encoded == NULL) {
            Py_DECREF(key_list);
            goto fail;
        }
        char *p = PyBytes_AS_STRING(encoded);
        for (int n = 0; n < 3; n++) {
            int field = order[n];
            memcpy(p, pieces[n], piece_lengths[n]);
            p += piece_lengths[n];
            if (field == 0) {
                for (Py_ssize_t k = 0; k < key_count; k++) {
                    Py_ssize_t length;
                    const char *key = PyUnicode_AsUTF8AndSize(PySequence_Fast_GET_ITEM(key_list, k), &length);
                    if (k > 0) *p++ = ' ';
                    memcpy(p, key, length);
                    p += length;
                }
            } else {
                memcpy(p, values[field], lengths[field]);
                p += lengths[field];
            }
        }
        memcpy(p, pieces[3], piece_lengths[3]);
        Py_DECREF(key_list);
        PyList_SET_ITEM(result, i, encoded);
    }
    return result;
fail:
    Py_DECREF(result);
    return NULL;
}

/* ---- Walking and checking records in bulk (codec.columnar) -------------------------- */

/* A growable column of int64s. */
typedef struct {
    int64_t *items;
    Py_ssize_t count, capacity;
} Column;

static int column_push(Column *column, int64_t value) {
    if (column->count == column->capacity) {
        Py_ssize_t capacity = column->capacity ? 2 * column->capacity : 1024;
        int64_t *items = PyMem_Realloc(column->items, capacity * sizeof(int64_t));
        if (items == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        column->items = items;
        column->capacity = capacity;
    }
    column->items[column->count++] = value;
    return 0;
}

static PyObject *column_bytes(const Column *column) {
    return PyByteArray_FromStringAndSize((const char *)column->items, column->count * (Py_ssize_t)sizeof(int64_t));
}

enum { PREFETCH_BYTES = 4096 };

/* walk_starts(buf, position, limit, rows_max) -> (starts, position): record starts from
 * position on while a header passes (v1/v2 magic, a size of at least the smallest
 * record's that fits the buffer) and the next start is before limit; columnar.walk's
 * loop, which then says why it ended. starts: a bytearray of native int64s. */
static PyObject *walk_starts(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "walk_starts takes (buf, position, limit, rows_max)");
        return NULL;
    }
    Py_ssize_t position = PyNumber_AsSsize_t(args[1], PyExc_OverflowError);
    Py_ssize_t limit = PyNumber_AsSsize_t(args[2], PyExc_OverflowError);
    Py_ssize_t rows_max = PyNumber_AsSsize_t(args[3], PyExc_OverflowError);
    if (PyErr_Occurred()) return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) return NULL;
    const unsigned char *buf = view.buf;
    Py_ssize_t size_end = view.len;
    if (limit > size_end - 7) limit = size_end - 7; /* a header's 8 bytes must fit */
    Column starts = {0};
    PyObject *result = NULL, *found = NULL;
    /* Each header's position comes from the one before, so the walk waits on memory at
     * every record; fetching the bytes ahead of it, a cache line at a time, lets the loads
     * overlap (and leaves the lines cached for the decode that copies them next). */
    Py_ssize_t ahead = position < 0 ? 0 : position;
    for (Py_ssize_t row = 0; row < rows_max && position >= 0 && position < limit; row++) {
        for (; ahead < position + PREFETCH_BYTES && ahead < size_end; ahead += 64) __builtin_prefetch(buf + ahead);
        int64_t size = (int32_t)be32(buf + position);
        uint32_t magic = be32(buf + position + 4);
        if ((magic != MAGIC_V1 && magic != MAGIC_V2) || size < MINIMUM_SIZE_V1 || position + size > size_end) break;
        if (column_push(&starts, position) < 0) goto done;
        position += size;
    }
    found = column_bytes(&starts);
    if (found != NULL) result = Py_BuildValue("(On)", found, position);
done:
    Py_XDECREF(found);
    PyMem_Free(starts.items);
    PyBuffer_Release(&view);
    return result;
}

/* CRC-32 (zlib's: reflected polynomial 0xEDB88320): folded with PCLMULQDQ where the CPU
 * has it, the rest (and everything elsewhere) slicing by 8. */
static uint32_t crc_table[8][256];
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define HAVE_CRC_FOLDING 1
static int crc_folding = 0; /* the CPU has PCLMULQDQ and SSE4.1 (set by crc_init) */
#endif

static void crc_init(void) {
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = n;
        for (int k = 0; k < 8; k++) c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        crc_table[0][n] = c;
    }
    for (uint32_t n = 0; n < 256; n++)
        for (int t = 1; t < 8; t++) crc_table[t][n] = (crc_table[t - 1][n] >> 8) ^ crc_table[0][crc_table[t - 1][n] & 0xFF];
#ifdef HAVE_CRC_FOLDING
    __builtin_cpu_init();
    crc_folding = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
#endif
}

#ifdef HAVE_CRC_FOLDING
/* The register c after the bytes p[0:n] (n a multiple of 16, at least 64), folded 64
 * bytes at a time with carry-less multiplication: Intel's "Fast CRC Computation for
 * Generic Polynomials Using PCLMULQDQ" (2009) for the reflected polynomial, with its
 * constants (x^k mod P for the fold distances, and the Barrett reduction's mu and P). */
__attribute__((target("pclmul,sse4.1"))) static uint32_t crc_fold(uint32_t c, const unsigned char *p, Py_ssize_t n) {
    const __m128i k1k2 = _mm_set_epi64x(0x1c6e41596, 0x154442bd4);
    const __m128i k3k4 = _mm_set_epi64x(0x0ccaa009e, 0x1751997d0);
    const __m128i k5 = _mm_set_epi64x(0, 0x163cd6124);
    const __m128i poly = _mm_set_epi64x(0x1f7011641, 0x1db710641);
    const __m128i mask32 = _mm_set_epi32(0, 0, 0, -1);
    __m128i x1 = _mm_xor_si128(_mm_loadu_si128((const __m128i *)p), _mm_cvtsi32_si128((int)c));
    __m128i x2 = _mm_loadu_si128((const __m128i *)(p + 16));
    __m128i x3 = _mm_loadu_si128((const __m128i *)(p + 32));
    __m128i x4 = _mm_loadu_si128((const __m128i *)(p + 48));
    p += 64;
    n -= 64;
#define FOLD(x, k, next) \
    _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x, k, 0x00), _mm_clmulepi64_si128(x, k, 0x11)), next)
    for (; n >= 64; p += 64, n -= 64) {
        x1 = FOLD(x1, k1k2, _mm_loadu_si128((const __m128i *)p));
        x2 = FOLD(x2, k1k2, _mm_loadu_si128((const __m128i *)(p + 16)));
        x3 = FOLD(x3, k1k2, _mm_loadu_si128((const __m128i *)(p + 32)));
        x4 = FOLD(x4, k1k2, _mm_loadu_si128((const __m128i *)(p + 48)));
    }
    x1 = FOLD(x1, k3k4, x2);
    x1 = FOLD(x1, k3k4, x3);
    x1 = FOLD(x1, k3k4, x4);
    for (; n >= 16; p += 16, n -= 16) x1 = FOLD(x1, k3k4, _mm_loadu_si128((const __m128i *)p));
#undef FOLD
    /* 128 bits to 64, then to 32, then the Barrett reduction. */
    x1 = _mm_xor_si128(_mm_clmulepi64_si128(k3k4, x1, 0x01), _mm_srli_si128(x1, 8));
    x1 = _mm_xor_si128(_mm_clmulepi64_si128(_mm_and_si128(x1, mask32), k5, 0x00), _mm_srli_si128(x1, 4));
    __m128i t = _mm_clmulepi64_si128(_mm_and_si128(x1, mask32), poly, 0x10);
    t = _mm_clmulepi64_si128(_mm_and_si128(t, mask32), poly, 0x00);
    return (uint32_t)_mm_extract_epi32(_mm_xor_si128(x1, t), 1);
}
#endif

static uint32_t crc32_of(const unsigned char *p, Py_ssize_t n) {
    uint32_t c = 0xFFFFFFFFu;
#ifdef HAVE_CRC_FOLDING
    if (crc_folding && n >= 64) {
        c = crc_fold(c, p, n & ~(Py_ssize_t)15);
        p += n & ~(Py_ssize_t)15;
        n &= 15;
    }
#endif
    while (n >= 8) {
        uint32_t low = c ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
        c = crc_table[7][low & 0xFF] ^ crc_table[6][(low >> 8) & 0xFF] ^ crc_table[5][(low >> 16) & 0xFF]
            ^ crc_table[4][low >> 24] ^ crc_table[3][p[4]] ^ crc_table[2][p[5]] ^ crc_table[1][p[6]]
            ^ crc_table[0][p[7]];
        p += 8;
        n -= 8;
    }
    while (n-- > 0) c = crc_table[0][(c ^ *p++) & 0xFF] ^ (c >> 8);
    return c ^ 0xFFFFFFFFu;
}

/* body_crcs(data, at, length) -> bytes: UtilAll.crc32 of each body data[at:at+length]
 * (zlib's CRC-32 & 0x7FFFFFFF, 0 for an empty body), as native int64s; at and length
 * are int64 buffers. */
static PyObject *body_crcs(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "body_crcs takes (data, at, length)");
        return NULL;
    }
    Py_buffer data, at, length;
    if (PyObject_GetBuffer(args[0], &data, PyBUF_SIMPLE) < 0) return NULL;
    if (PyObject_GetBuffer(args[1], &at, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&data);
        return NULL;
    }
    if (PyObject_GetBuffer(args[2], &length, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&data);
        PyBuffer_Release(&at);
        return NULL;
    }
    PyObject *result = NULL;
    Py_ssize_t rows = at.len / 8;
    if (at.len != length.len || at.len % 8 != 0) {
        PyErr_SetString(PyExc_ValueError, "body_crcs: at and length are int64 columns of one length");
        goto done;
    }
    const int64_t *ats = at.buf, *lengths = length.buf;
    for (Py_ssize_t i = 0; i < rows; i++) {
        if (ats[i] < 0 || lengths[i] < 0 || ats[i] + lengths[i] > data.len) {
            PyErr_SetString(PyExc_ValueError, "body_crcs: a body outside the data");
            goto done;
        }
    }
    result = PyBytes_FromStringAndSize(NULL, rows * 8);
    if (result == NULL) goto done;
    int64_t *crcs = (int64_t *)PyBytes_AS_STRING(result);
    const unsigned char *bytes = data.buf;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < rows; i++)
        crcs[i] = lengths[i] ? (int64_t)(crc32_of(bytes + ats[i], lengths[i]) & 0x7FFFFFFF) : 0;
    Py_END_ALLOW_THREADS
done:
    PyBuffer_Release(&data);
    PyBuffer_Release(&at);
    PyBuffer_Release(&length);
    return result;
}

/* ---- Dispatch plans over bulk-decoded records (dispatch.DispatchBatch.of_columns) --- */

/* Borrowed buffers of the int64 columns of a call, released together. */
typedef struct {
    Py_buffer views[8];
    int count;
} Buffers;

static void release_buffers(Buffers *buffers) {
    for (int i = 0; i < buffers->count; i++) PyBuffer_Release(&buffers->views[i]);
    buffers->count = 0;
}

/* The buffer of args[i], which must hold whole int64s (or bytes when item is 1). */
static const void *take_buffer(Buffers *buffers, PyObject *object, Py_ssize_t item, Py_ssize_t *items) {
    Py_buffer *view = &buffers->views[buffers->count];
    if (PyObject_GetBuffer(object, view, PyBUF_SIMPLE) < 0) return NULL;
    buffers->count++;
    if (view->len % item != 0) {
        PyErr_SetString(PyExc_ValueError, "a column of int64s has a partial item");
        return NULL;
    }
    *items = view->len / item;
    return view->buf;
}

/* span_texts(data, at, length) -> list[str | None]: data[at:at+length] decoded as UTF-8
 * ("replace") for each span, None where at is negative. Spans repeat (topics, tags): the
 * distinct texts of the call are shared. */
static PyObject *span_texts(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "span_texts takes (data, at, length)");
        return NULL;
    }
    Buffers buffers = {.count = 0};
    Py_ssize_t size, rows, rows_length;
    PyObject *result = NULL;
    enum { SEEN_MAX = 64 };
    PyObject *seen[SEEN_MAX];
    const unsigned char *seen_at[SEEN_MAX];
    int64_t seen_length[SEEN_MAX];
    int seen_count = 0;
    const unsigned char *data = take_buffer(&buffers, args[0], 1, &size);
    const int64_t *at = data == NULL ? NULL : take_buffer(&buffers, args[1], 8, &rows);
    const int64_t *length = at == NULL ? NULL : take_buffer(&buffers, args[2], 8, &rows_length);
    if (length == NULL) goto done;
    if (rows != rows_length) {
        PyErr_SetString(PyExc_ValueError, "span_texts: at and length differ in length");
        goto done;
    }
    result = PyList_New(rows);
    if (result == NULL) goto done;
    for (Py_ssize_t row = 0; row < rows; row++) {
        PyObject *text = NULL;
        if (at[row] < 0) {
            text = Py_NewRef(Py_None);
        } else if (length[row] < 0 || at[row] + length[row] > size) {
            PyErr_SetString(PyExc_ValueError, "span_texts: a span outside the data");
        } else {
            const unsigned char *start = data + at[row];
            for (int i = 0; i < seen_count && text == NULL; i++)
                if (seen_length[i] == length[row] && memcmp(seen_at[i], start, length[row]) == 0)
                    text = Py_NewRef(seen[i]);
            if (text == NULL) {
                text = PyUnicode_DecodeUTF8((const char *)start, length[row], "replace");
                if (text != NULL && seen_count < SEEN_MAX) {
                    seen[seen_count] = text; /* borrowed: the result list holds it */
                    seen_at[seen_count] = start;
                    seen_length[seen_count++] = length[row];
                }
            }
        }
        if (text == NULL) {
            Py_CLEAR(result);
            goto done;
        }
        PyList_SET_ITEM(result, row, text);
    }
done:
    release_buffers(&buffers);
    return result;
}

static inline int64_t index_hash_of(uint32_t h) {
    int32_t signed_h = (int32_t)h;
    return signed_h == INT32_MIN ? 0 : (signed_h < 0 ? -(int64_t)signed_h : signed_h);
}

/* span_key_hashes(data, prefixes, uniq_at, uniq_length, keys_at, keys_length)
 *     -> (hashes, counts) | None
 *
 * The index hashes of each row's keys in put order: its UNIQ_KEY, then each non-empty
 * part of its KEYS split at spaces, each hashed as prefix + key (prefixes: the uint32
 * String.hashCode of the row's "topic#", as int64s). A negative at: the row has no such
 * value (or is not indexed). hashes and counts (keys per row) are bytes of native int64s.
 * None if a value holds a byte above 0x7F: then UTF-16 code units are not the bytes, and
 * the caller hashes decoded strings. */
static PyObject *span_key_hashes(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError,
                        "span_key_hashes takes (data, prefixes, uniq_at, uniq_length, keys_at, keys_length)");
        return NULL;
    }
    Buffers buffers = {.count = 0};
    Py_ssize_t size, counts_of[5];
    const int64_t *columns[5];
    PyObject *hashes = NULL, *counts = NULL, *result = NULL;
    const unsigned char *data = take_buffer(&buffers, args[0], 1, &size);
    if (data == NULL) goto done;
    for (int i = 0; i < 5; i++) {
        columns[i] = take_buffer(&buffers, args[i + 1], 8, &counts_of[i]);
        if (columns[i] == NULL) goto done;
        if (counts_of[i] != counts_of[0]) {
            PyErr_SetString(PyExc_ValueError, "span_key_hashes: columns of different lengths");
            goto done;
        }
    }
    const int64_t *prefixes = columns[0], *uniq_at = columns[1], *uniq_length = columns[2], *keys_at = columns[3],
                  *keys_length = columns[4];
    Py_ssize_t rows = counts_of[0];
    /* At most one key per value byte (a part is a byte and a space) plus the UNIQ_KEY. */
    Py_ssize_t bound = 0;
    for (Py_ssize_t row = 0; row < rows; row++) {
        for (int value = 0; value < 2; value++) {
            int64_t a = value ? keys_at[row] : uniq_at[row], n = value ? keys_length[row] : uniq_length[row];
            if (a < 0) continue;
            if (n < 0 || a + n > size) {
                PyErr_SetString(PyExc_ValueError, "span_key_hashes: a span outside the data");
                goto done;
            }
            for (int64_t i = 0; i < n; i++)
                if (data[a + i] & 0x80) {
                    result = Py_NewRef(Py_None);
                    goto done;
                }
            bound += value ? (n + 1) / 2 : 1;
        }
    }
    hashes = PyBytes_FromStringAndSize(NULL, bound * 8);
    counts = PyBytes_FromStringAndSize(NULL, rows * 8);
    if (hashes == NULL || counts == NULL) goto done;
    int64_t *out = (int64_t *)PyBytes_AS_STRING(hashes), *count_out = (int64_t *)PyBytes_AS_STRING(counts);
    Py_ssize_t emitted = 0;
    for (Py_ssize_t row = 0; row < rows; row++) {
        Py_ssize_t first = emitted;
        uint32_t prefix = (uint32_t)prefixes[row];
        if (uniq_at[row] >= 0) {
            uint32_t h = prefix;
            for (const unsigned char *p = data + uniq_at[row], *end = p + uniq_length[row]; p < end; p++) h = 31 * h + *p;
            out[emitted++] = index_hash_of(h);
        }
        if (keys_at[row] >= 0) {
            const unsigned char *p = data + keys_at[row], *end = p + keys_length[row];
            while (p < end) {
                while (p < end && *p == ' ') p++;
                if (p == end) break;
                uint32_t h = prefix;
                while (p < end && *p != ' ') h = 31 * h + *p++;
                out[emitted++] = index_hash_of(h);
            }
        }
        count_out[row] = emitted - first;
    }
    if (_PyBytes_Resize(&hashes, emitted * 8) < 0) goto done;
    result = PyTuple_Pack(2, hashes, counts);
done:
    Py_XDECREF(hashes);
    Py_XDECREF(counts);
    release_buffers(&buffers);
    return result;
}

/* ---- Dispatch plans of a writer's batch (dispatch.DispatchBatch.of_messages) -------- */

/* tags_codes(tags) -> list[int]: consumequeue.tags_code of each: String.hashCode of the
 * whole TAGS value, 0 when it is None or empty. */
static PyObject *tags_codes(PyObject *module, PyObject *tags) {
    if (!PyList_Check(tags)) {
        PyErr_SetString(PyExc_TypeError, "tags_codes takes a list");
        return NULL;
    }
    Py_ssize_t count = PyList_GET_SIZE(tags);
    PyObject *result = PyList_New(count);
    if (result == NULL) return NULL;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *text = PyList_GET_ITEM(tags, i), *code;
        if (text == Py_None) {
            code = PyLong_FromLong(0);
        } else if (PyUnicode_Check(text)) {
            code = PyLong_FromLong((int32_t)hash_units(0, text));
        } else {
            PyErr_SetString(PyExc_TypeError, "a TAGS value is a str or None");
            code = NULL;
        }
        if (code == NULL) {
            Py_DECREF(result);
            return NULL;
        }
        PyList_SET_ITEM(result, i, code);
    }
    return result;
}

/* message_key_hashes(prefixes, uniq_keys, keys) -> (hashes, counts)
 *
 * The index hashes of each message's keys in put order: its UNIQ_KEY, then each of its
 * KEYS (already split), hashed as prefix + key over UTF-16 code units (prefixes: the
 * uint32 String.hashCode of the message's "topic#", as int64s). hashes and counts (keys
 * per message) are bytes of native int64s. */
static PyObject *message_key_hashes(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3 || !PyList_Check(args[1]) || !PyList_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "message_key_hashes takes (prefixes, uniq_keys: list, keys: list)");
        return NULL;
    }
    Buffers buffers = {.count = 0};
    Py_ssize_t rows;
    PyObject *uniq_keys = args[1], *keys = args[2], *hashes = NULL, *counts = NULL, *result = NULL;
    const int64_t *prefixes = take_buffer(&buffers, args[0], 8, &rows);
    if (prefixes == NULL) goto done;
    if (PyList_GET_SIZE(uniq_keys) != rows || PyList_GET_SIZE(keys) != rows) {
        PyErr_SetString(PyExc_ValueError, "message_key_hashes: columns of different lengths");
        goto done;
    }
    Py_ssize_t total = rows;
    for (Py_ssize_t row = 0; row < rows; row++) {
        Py_ssize_t n = PyObject_Length(PyList_GET_ITEM(keys, row));
        if (n < 0) goto done;
        total += n;
    }
    hashes = PyBytes_FromStringAndSize(NULL, total * 8);
    counts = PyBytes_FromStringAndSize(NULL, rows * 8);
    if (hashes == NULL || counts == NULL) goto done;
    int64_t *out = (int64_t *)PyBytes_AS_STRING(hashes), *count_out = (int64_t *)PyBytes_AS_STRING(counts);
    Py_ssize_t emitted = 0;
    for (Py_ssize_t row = 0; row < rows; row++) {
        uint32_t prefix = (uint32_t)prefixes[row];
        PyObject *uniq = PyList_GET_ITEM(uniq_keys, row);
        PyObject *parts = PySequence_Fast(PyList_GET_ITEM(keys, row), "KEYS is a sequence of str");
        if (parts == NULL) goto done;
        Py_ssize_t part_count = PySequence_Fast_GET_SIZE(parts);
        if (!PyUnicode_Check(uniq) || emitted + 1 + part_count > total) {
            PyErr_SetString(PyExc_TypeError, "a UNIQ_KEY is a str (and KEYS did not change)");
            Py_DECREF(parts);
            goto done;
        }
        out[emitted++] = index_hash_of(hash_units(prefix, uniq));
        for (Py_ssize_t k = 0; k < part_count; k++) {
            PyObject *part = PySequence_Fast_GET_ITEM(parts, k);
            if (!PyUnicode_Check(part)) {
                PyErr_SetString(PyExc_TypeError, "a key is a str");
                Py_DECREF(parts);
                goto done;
            }
            out[emitted++] = index_hash_of(hash_units(prefix, part));
        }
        Py_DECREF(parts);
        count_out[row] = 1 + part_count;
    }
    if (_PyBytes_Resize(&hashes, emitted * 8) < 0) goto done;
    result = PyTuple_Pack(2, hashes, counts);
done:
    Py_XDECREF(hashes);
    Py_XDECREF(counts);
    release_buffers(&buffers);
    return result;
}

/* ---- The properties' pairs in bulk (codec.columnar._pairs) --------------------------- */

/* A name of the pairs at names[first:last] (their at, length) equal to another's bytes, or
 * one with a byte above 0x7F (names that are not UTF-8 may decode to one text): the row
 * needs the decoded names' dictionary, which the caller builds. */
static int names_may_repeat(const unsigned char *data, const int64_t *name_at, const int64_t *name_length,
                            Py_ssize_t first, Py_ssize_t last) {
    enum { COMPARED_MAX = 64 };
    if (last - first < 2) return 0;
    if (last - first > COMPARED_MAX) return 1;
    for (Py_ssize_t i = first; i < last; i++) {
        const unsigned char *name = data + name_at[i];
        for (int64_t k = 0; k < name_length[i]; k++)
            if (name[k] >= 0x80) return 1;
        for (Py_ssize_t j = first; j < i; j++)
            if (name_length[j] == name_length[i] && memcmp(data + name_at[j], name, name_length[i]) == 0) return 1;
    }
    return 0;
}

/* property_pairs(data, at, length)
 *     -> (pair_ends, name_at, name_length, value_at, value_length, keys, tags, uniq_key, repeated)
 *
 * MessageDecoder.string2messageProperties over each row's span data[at:at+length]: the
 * span cut at every 0x02; a segment is a pair when its first 0x01 lies after its first
 * byte and before its last. All results are bytearrays of native int64s: pair_ends
 * (rows + 1), the pairs' name and value spans in order, per row the pair named KEYS, TAGS
 * and UNIQ_KEY (or -1), and the rows whose names may repeat (their pairs are as found;
 * the caller applies the dictionary's rules to them). */
static PyObject *property_pairs(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "property_pairs takes (data, at, length)");
        return NULL;
    }
    Buffers buffers = {.count = 0};
    Py_ssize_t size, rows, rows_length;
    PyObject *result = NULL, *named[3] = {NULL, NULL, NULL}, *ends = NULL, *spans[5] = {NULL};
    Column name_at = {0}, name_length = {0}, value_at = {0}, value_length = {0}, repeated = {0};
    const unsigned char *data = take_buffer(&buffers, args[0], 1, &size);
    const int64_t *at = data == NULL ? NULL : take_buffer(&buffers, args[1], 8, &rows);
    const int64_t *length = at == NULL ? NULL : take_buffer(&buffers, args[2], 8, &rows_length);
    if (length == NULL) goto done;
    if (rows != rows_length) {
        PyErr_SetString(PyExc_ValueError, "property_pairs: at and length differ in length");
        goto done;
    }
    for (Py_ssize_t row = 0; row < rows; row++) {
        if (at[row] < 0 || length[row] < 0 || at[row] + length[row] > size) {
            PyErr_SetString(PyExc_ValueError, "property_pairs: a span outside the data");
            goto done;
        }
    }
    ends = PyByteArray_FromStringAndSize(NULL, (rows + 1) * (Py_ssize_t)sizeof(int64_t));
    for (int n = 0; n < 3 && ends != NULL; n++) {
        named[n] = PyByteArray_FromStringAndSize(NULL, rows * (Py_ssize_t)sizeof(int64_t));
        if (named[n] == NULL) goto done;
    }
    if (ends == NULL) goto done;
    int64_t *pair_ends = (int64_t *)PyByteArray_AS_STRING(ends);
    int64_t *holders[3];
    for (int n = 0; n < 3; n++) holders[n] = (int64_t *)PyByteArray_AS_STRING(named[n]);
    pair_ends[0] = 0;
    for (Py_ssize_t row = 0; row < rows; row++) {
        const unsigned char *p = data + at[row], *end = p + length[row], *name, *value;
        Py_ssize_t first = name_at.count, n_length, v_length;
        holders[0][row] = holders[1][row] = holders[2][row] = -1;
        while (next_property(&p, end, &name, &n_length, &value, &v_length)) {
            int64_t pair = name_at.count;
            if (column_push(&name_at, name - data) < 0 || column_push(&name_length, n_length) < 0
                || column_push(&value_at, value - data) < 0 || column_push(&value_length, v_length) < 0)
                goto done;
            int named = named_property(name, n_length);
            if (named >= 0) holders[named][row] = pair;
        }
        pair_ends[row + 1] = name_at.count;
        if (names_may_repeat(data, name_at.items, name_length.items, first, name_at.count)
            && column_push(&repeated, row) < 0)
            goto done;
    }
    spans[0] = column_bytes(&name_at);
    spans[1] = column_bytes(&name_length);
    spans[2] = column_bytes(&value_at);
    spans[3] = column_bytes(&value_length);
    spans[4] = column_bytes(&repeated);
    if (spans[0] && spans[1] && spans[2] && spans[3] && spans[4])
        result = PyTuple_Pack(9, ends, spans[0], spans[1], spans[2], spans[3], named[0], named[1], named[2], spans[4]);
done:
    Py_XDECREF(ends);
    for (int n = 0; n < 5; n++) Py_XDECREF(spans[n]);
    for (int n = 0; n < 3; n++) Py_XDECREF(named[n]);
    PyMem_Free(name_at.items);
    PyMem_Free(name_length.items);
    PyMem_Free(value_at.items);
    PyMem_Free(value_length.items);
    PyMem_Free(repeated.items);
    release_buffers(&buffers);
    return result;
}

/* ---- Arrow columns of walked records (pipeline.columns: the Spark data source) ------ */

/* Strict UTF-8 (RFC 3629: no overlong forms, surrogates, or code points past U+10FFFF),
 * the texts Arrow accepts and Python decodes without replacing anything. */
static int utf8_valid(const unsigned char *s, Py_ssize_t n) {
    Py_ssize_t i = 0;
    while (i < n) {
        if (i + 8 <= n) {
            uint64_t word;
            memcpy(&word, s + i, 8);
            if ((word & 0x8080808080808080ull) == 0) {
                i += 8;
                continue;
            }
        }
        unsigned char c = s[i];
        if (c < 0x80) {
            i++;
        } else if (c < 0xC2) {
            return 0;
        } else if (c < 0xE0) {
            if (i + 1 >= n || (s[i + 1] & 0xC0) != 0x80) return 0;
            i += 2;
        } else if (c < 0xF0) {
            if (i + 2 >= n || (s[i + 1] & 0xC0) != 0x80 || (s[i + 2] & 0xC0) != 0x80) return 0;
            if ((c == 0xE0 && s[i + 1] < 0xA0) || (c == 0xED && s[i + 1] >= 0xA0)) return 0;
            i += 3;
        } else if (c < 0xF5) {
            if (i + 3 >= n || (s[i + 1] & 0xC0) != 0x80 || (s[i + 2] & 0xC0) != 0x80 || (s[i + 3] & 0xC0) != 0x80)
                return 0;
            if ((c == 0xF0 && s[i + 1] < 0x90) || (c == 0xF4 && s[i + 1] >= 0x90)) return 0;
            i += 4;
        } else {
            return 0;
        }
    }
    return 1;
}

/* An Arrow buffer being filled: an object from the caller's allocate(capacity) (Arrow's
 * pool: its memory is reused batch after batch, where fresh memory would fault in page by
 * page), sized for the most it can hold, written through its buffer. */
typedef struct {
    PyObject *object;
    Py_buffer view;
    char *data;
    Py_ssize_t used;
} Out;

static int out_open(Out *out, PyObject *allocate, Py_ssize_t capacity) {
    PyObject *size = PyLong_FromSsize_t(capacity);
    if (size == NULL) return -1;
    out->object = PyObject_CallOneArg(allocate, size);
    Py_DECREF(size);
    if (out->object == NULL) return -1;
    if (PyObject_GetBuffer(out->object, &out->view, PyBUF_WRITABLE) < 0) {
        Py_CLEAR(out->object);
        return -1;
    }
    if (out->view.len < capacity) {
        PyBuffer_Release(&out->view);
        Py_CLEAR(out->object);
        PyErr_SetString(PyExc_ValueError, "arrow_columns: allocate gave a smaller buffer than asked for");
        return -1;
    }
    out->data = out->view.buf;
    out->used = 0;
    return 0;
}

/* The buffer's object, as a new reference (out no longer holds it). */
static PyObject *out_close(Out *out) {
    PyObject *object = out->object;
    if (object != NULL) PyBuffer_Release(&out->view);
    out->object = NULL;
    return object;
}

static void out_free(Out *out) { Py_XDECREF(out_close(out)); }

/* A variable-width column: int32 offsets (items + 1) and the bytes; optionally a validity
 * bitmap (a set bit: a value). */
typedef struct {
    Out offsets, chars, validity;
    Py_ssize_t count, nulls;
    int nullable;
} Texts;

static int texts_open(Texts *texts, PyObject *allocate, Py_ssize_t items, Py_ssize_t chars, int nullable) {
    texts->count = texts->nulls = 0;
    texts->nullable = nullable;
    if (out_open(&texts->offsets, allocate, (items + 1) * 4) < 0 || out_open(&texts->chars, allocate, chars) < 0)
        return -1;
    ((int32_t *)texts->offsets.data)[0] = 0;
    if (nullable) {
        if (out_open(&texts->validity, allocate, (items + 7) / 8) < 0) return -1;
        memset(texts->validity.data, 0, (items + 7) / 8);
    }
    return 0;
}

static inline void texts_add(Texts *texts, const unsigned char *p, Py_ssize_t n) {
    memcpy(texts->chars.data + texts->chars.used, p, n);
    texts->chars.used += n;
    if (texts->nullable) texts->validity.data[texts->count >> 3] |= (char)(1 << (texts->count & 7));
    ((int32_t *)texts->offsets.data)[++texts->count] = (int32_t)texts->chars.used;
}

static inline void texts_add_null(Texts *texts) {
    texts->nulls++;
    ((int32_t *)texts->offsets.data)[texts->count + 1] = (int32_t)texts->chars.used;
    texts->count++;
}

/* (offsets, chars) or, nullable, (validity, offsets, chars, nulls). */
static PyObject *texts_close(Texts *texts) {
    PyObject *offsets = out_close(&texts->offsets), *chars = out_close(&texts->chars);
    PyObject *validity = texts->nullable ? out_close(&texts->validity) : NULL;
    if (offsets == NULL || chars == NULL || (texts->nullable && validity == NULL)) {
        Py_XDECREF(offsets);
        Py_XDECREF(chars);
        Py_XDECREF(validity);
        return NULL;
    }
    if (texts->nullable) return Py_BuildValue("(NNNn)", validity, offsets, chars, texts->nulls);
    return Py_BuildValue("(NN)", offsets, chars);
}

static void texts_free(Texts *texts) {
    out_free(&texts->offsets);
    out_free(&texts->chars);
    out_free(&texts->validity);
}

enum { FIXED_COLUMNS = 11, ARROW_PAIRS_MAX = 64 };
/* The fixed-width columns, in the order arrow_columns returns them, and their widths. */
enum { C_OFFSET, C_SIZE, C_QUEUE_ID, C_QUEUE_OFFSET, C_SYS_FLAG, C_FLAG, C_BODY_CRC, C_BORN_TS, C_STORE_TS,
       C_RECONSUME, C_PREPARED };
static const int fixed_width[FIXED_COLUMNS] = {8, 4, 4, 8, 4, 4, 4, 8, 8, 4, 8};

typedef struct {
    Out fixed[FIXED_COLUMNS];
    Texts msg_id, topic, born_host, store_host, body, names, values, named[3];
    Out pair_ends;
} ArrowOut;

static void arrow_out_free(ArrowOut *out) {
    for (int c = 0; c < FIXED_COLUMNS; c++) out_free(&out->fixed[c]);
    out_free(&out->pair_ends);
    texts_free(&out->msg_id);
    texts_free(&out->topic);
    texts_free(&out->born_host);
    texts_free(&out->store_host);
    texts_free(&out->body);
    texts_free(&out->names);
    texts_free(&out->values);
    for (int n = 0; n < 3; n++) texts_free(&out->named[n]);
}

static inline char *decimal(char *q, int64_t value) {
    char digits[20];
    int n = 0;
    uint64_t magnitude = value < 0 ? (uint64_t)0 - (uint64_t)value : (uint64_t)value;
    if (value < 0) *q++ = '-';
    do {
        digits[n++] = (char)('0' + magnitude % 10);
        magnitude /= 10;
    } while (magnitude);
    while (n) *q++ = digits[--n];
    return q;
}

enum { HOST_TEXT_MAX = 51 }; /* 8 groups of 4 hex digits, 7 colons, ':' and "-2147483648" */

/* SocketAddress.java_text of an address (4 or 16 bytes) followed by its port's 4 bytes:
 * dotted IPv4 (also for an IPv4-mapped IPv6 address), else eight lowercase hex groups. */
static Py_ssize_t host_text_at(const unsigned char *p, Py_ssize_t width, char *text) {
    static const unsigned char mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF};
    static const char hex[] = "0123456789abcdef";
    char *q = text;
    const unsigned char *v4 = width == 4 ? p : memcmp(p, mapped, 12) == 0 ? p + 12 : NULL;
    if (v4 != NULL) {
        for (int i = 0; i < 4; i++) {
            if (i) *q++ = '.';
            q = decimal(q, v4[i]);
        }
    } else {
        for (int group = 0; group < 8; group++) {
            unsigned value = (unsigned)p[2 * group] << 8 | p[2 * group + 1];
            int shift = 12;
            if (group) *q++ = ':';
            while (shift > 0 && (value >> shift) == 0) shift -= 4;
            for (; shift >= 0; shift -= 4) *q++ = hex[(value >> shift) & 0xF];
        }
    }
    *q++ = ':';
    q = decimal(q, (int32_t)be32(p + width));
    return q - text;
}

/* A host column: each row's text, the last one's bytes kept (a batch has few hosts). */
typedef struct {
    unsigned char raw[20];
    Py_ssize_t width, length;
    char text[HOST_TEXT_MAX];
} HostText;

static inline void add_host(Texts *texts, HostText *last, const unsigned char *p, Py_ssize_t width) {
    if (last->width != width || memcmp(last->raw, p, width + 4) != 0) {
        memcpy(last->raw, p, width + 4);
        last->width = width;
        last->length = host_text_at(p, width, last->text);
    }
    texts_add(texts, (const unsigned char *)last->text, last->length);
}

static inline void put_fixed(Out *column, Py_ssize_t row, int width, int64_t value) {
    if (width == 8)
        ((int64_t *)column->data)[row] = value;
    else
        ((int32_t *)column->data)[row] = (int32_t)value;
}

/* arrow_columns(buf, starts, base_offset, check_crc, allocate) -> tuple | None
 *
 * columnar.decode and pipeline.columns.arrow_batch in one pass: the records at starts (the
 * consecutive int64 positions columnar.walk found in buf, whose first byte is at commit
 * log offset base_offset) read straight into Arrow's buffers, each record checked as
 * decode checks it; the columns end before the first record that fails (bad: its index
 * in starts, else -1). Buffers come from allocate(size), which returns a writable
 * buffer of at least size bytes; each is returned whole, longer than its column needs.
 * Returns
 *     (rows, bad, fixed, msg_id, topic, born_host, store_host, body, properties, named)
 * fixed: the 11 numeric columns (commitLogOffset … preparedTransactionOffset, int64 or
 * int32 as the schema has them); msg_id, topic, hosts, body: (offsets, chars);
 * properties: (pair_ends, (name offsets, chars), (value offsets, chars)); named: KEYS,
 * TAGS and UNIQ_KEY as (validity, offsets, chars, nulls).
 * None when a record before any bad one needs the general path: a text that is not
 * UTF-8, a property name given twice, more than 64 properties. */
static PyObject *arrow_columns(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "arrow_columns takes (buf, starts, base_offset, check_crc, allocate)");
        return NULL;
    }
    PyObject *allocate = args[4];
    static const char hex[] = "0123456789ABCDEF";
    long long base_offset = PyLong_AsLongLong(args[2]);
    int check_crc = PyObject_IsTrue(args[3]);
    if (PyErr_Occurred() || check_crc < 0) return NULL;
    Buffers buffers = {.count = 0};
    Py_ssize_t length, rows;
    ArrowOut out;
    memset(&out, 0, sizeof out);
    PyObject *result = NULL;
    const unsigned char *buf = take_buffer(&buffers, args[0], 1, &length);
    const int64_t *starts = buf == NULL ? NULL : take_buffer(&buffers, args[1], 8, &rows);
    if (starts == NULL) goto done;
    if (rows == 0) {
        PyErr_SetString(PyExc_ValueError, "arrow_columns needs at least one record start");
        goto done;
    }
    int64_t first = starts[0], last = starts[rows - 1];
    if (first < 0 || last < first || last > length - 8) {
        PyErr_SetString(PyExc_ValueError, "arrow_columns: a start outside the buffer");
        goto done;
    }
    /* Every variable-width value lies inside the records: none is longer than the span. */
    int64_t span = last + (int32_t)be32(buf + last) - first;
    if (span < 0 || span > length - first) span = length - first;
    if (span + (56 + HOST_TEXT_MAX) * rows >= INT32_MAX) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    Py_ssize_t pairs_max = span / 3 + rows + 1;
    for (int c = 0; c < FIXED_COLUMNS; c++)
        if (out_open(&out.fixed[c], allocate, rows * fixed_width[c]) < 0) goto done;
    if (out_open(&out.pair_ends, allocate, (rows + 1) * 4) < 0
        || texts_open(&out.born_host, allocate, rows, HOST_TEXT_MAX * rows, 0) < 0
        || texts_open(&out.store_host, allocate, rows, HOST_TEXT_MAX * rows, 0) < 0
        || texts_open(&out.msg_id, allocate, rows, 56 * rows, 0) < 0 || texts_open(&out.topic, allocate, rows, span, 0) < 0
        || texts_open(&out.body, allocate, rows, span, 0) < 0 || texts_open(&out.names, allocate, pairs_max, span, 0) < 0
        || texts_open(&out.values, allocate, pairs_max, span, 0) < 0)
        goto done;
    for (int n = 0; n < 3; n++)
        if (texts_open(&out.named[n], allocate, rows, span, 1) < 0) goto done;

    Py_ssize_t row = 0, bad = -1;
    int general = 0, overlapping = 0;
    HostText born_last = {.width = 0}, store_last = {.width = 0};
    int64_t next_at = first; /* records may not overlap: the span bounds what they hold */
    int32_t *pair_ends = (int32_t *)out.pair_ends.data;
    pair_ends[0] = 0;
    Py_BEGIN_ALLOW_THREADS
    for (; row < rows; row++) {
        int64_t at = starts[row];
        if (at < 0 || at > length - 8) { bad = row; break; }
        const unsigned char *r = buf + at;
        Layout l;
        if (record_layout(r, length - at, &l) < 0) {
            bad = row;
            break;
        }
        if (at < next_at || at + l.total > first + span) {
            overlapping = 1;
            break;
        }
        next_at = at + l.total;
        int64_t offset = be64(r + 28);
        if (offset != base_offset + at) { bad = row; break; }
        int32_t stored_crc = (int32_t)be32(r + 8);
        if (check_crc && l.body_length > 0 && (int32_t)(crc32_of(l.body, l.body_length) & 0x7FFFFFFF) != stored_crc) {
            bad = row;
            break;
        }
        if (!utf8_valid(l.topic, l.topic_length)) { general = 1; break; }

        /* The record's pairs (a name given twice takes the general path). */
        Py_ssize_t first_pair = out.names.count, holder[3] = {-1, -1, -1}, name_length, value_length;
        const unsigned char *p = l.properties, *end = l.properties + l.properties_length, *name, *value;
        while (!general && next_property(&p, end, &name, &name_length, &value, &value_length)) {
            const int32_t *name_ends = (const int32_t *)out.names.offsets.data;
            if (out.names.count - first_pair >= ARROW_PAIRS_MAX || !utf8_valid(name, name_length)
                || !utf8_valid(value, value_length)) {
                general = 1;
                break;
            }
            for (Py_ssize_t pair = first_pair; pair < out.names.count; pair++)
                if (name_ends[pair + 1] - name_ends[pair] == name_length
                    && memcmp(out.names.chars.data + name_ends[pair], name, name_length) == 0)
                    general = 1;
            if (general) break;
            int named = named_property(name, name_length);
            if (named >= 0) holder[named] = out.values.count;
            texts_add(&out.names, name, name_length);
            texts_add(&out.values, value, value_length);
        }
        if (general) break;
        pair_ends[row + 1] = (int32_t)out.names.count;
        for (int n = 0; n < 3; n++) {
            if (holder[n] < 0) {
                texts_add_null(&out.named[n]);
            } else {
                const int32_t *value_ends = (const int32_t *)out.values.offsets.data;
                texts_add(&out.named[n], (const unsigned char *)out.values.chars.data + value_ends[holder[n]],
                          value_ends[holder[n] + 1] - value_ends[holder[n]]);
            }
        }

        /* offsetMsgId: the store host's address and port bytes, then PHYSICALOFFSET, in hex. */
        unsigned char raw[28];
        memcpy(raw, l.store, l.store_width + 4);
        memcpy(raw + l.store_width + 4, r + 28, 8);
        unsigned char text[56];
        Py_ssize_t raw_length = l.store_width + 12;
        for (Py_ssize_t i = 0; i < raw_length; i++) {
            text[2 * i] = hex[raw[i] >> 4];
            text[2 * i + 1] = hex[raw[i] & 0xF];
        }
        texts_add(&out.msg_id, text, 2 * raw_length);
        texts_add(&out.topic, l.topic, l.topic_length);
        texts_add(&out.body, l.body, l.body_length);
        add_host(&out.born_host, &born_last, l.born, l.born_width);
        add_host(&out.store_host, &store_last, l.store, l.store_width);
        int64_t values[FIXED_COLUMNS] = {
            [C_OFFSET] = offset,
            [C_SIZE] = l.total,
            [C_QUEUE_ID] = (int32_t)be32(r + 12),
            [C_QUEUE_OFFSET] = be64(r + 20),
            [C_SYS_FLAG] = l.sys_flag,
            [C_FLAG] = (int32_t)be32(r + 16),
            [C_BODY_CRC] = stored_crc,
            [C_BORN_TS] = be64(r + 40),
            [C_STORE_TS] = be64(l.store_ts),
            [C_RECONSUME] = (int32_t)be32(l.reconsume),
            [C_PREPARED] = be64(l.reconsume + 4),
        };
        for (int c = 0; c < FIXED_COLUMNS; c++) put_fixed(&out.fixed[c], row, fixed_width[c], values[c]);
    }
    Py_END_ALLOW_THREADS
    if (overlapping) {
        PyErr_SetString(PyExc_ValueError, "arrow_columns: records overlap (starts must come from columnar.walk)");
        goto done;
    }
    if (general) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    /* row: the records decoded. */
    PyObject *fixed = PyTuple_New(FIXED_COLUMNS);
    if (fixed == NULL) goto done;
    for (int c = 0; c < FIXED_COLUMNS; c++) {
        PyObject *column = out_close(&out.fixed[c]);
        if (column == NULL) {
            Py_DECREF(fixed);
            goto done;
        }
        PyTuple_SET_ITEM(fixed, c, column);
    }
    PyObject *parts[9] = {NULL};
    parts[0] = texts_close(&out.msg_id);
    parts[1] = texts_close(&out.topic);
    parts[2] = texts_close(&out.born_host);
    parts[3] = texts_close(&out.store_host);
    parts[4] = texts_close(&out.body);
    PyObject *ends = out_close(&out.pair_ends), *names = texts_close(&out.names), *values = texts_close(&out.values);
    parts[5] = ends && names && values ? Py_BuildValue("(NNN)", ends, names, values) : NULL;
    if (parts[5] == NULL) {
        Py_XDECREF(ends);
        Py_XDECREF(names);
        Py_XDECREF(values);
    }
    for (int n = 0; n < 3; n++) parts[6 + n] = texts_close(&out.named[n]);
    int complete = 1;
    for (int i = 0; i < 9; i++) complete &= parts[i] != NULL;
    if (complete) {
        PyObject *named = Py_BuildValue("(NNN)", parts[6], parts[7], parts[8]);
        if (named != NULL)
            result = Py_BuildValue("(nnNNNNNNNN)", row, bad, fixed, parts[0], parts[1], parts[2], parts[3], parts[4],
                                   parts[5], named);
    } else {
        Py_DECREF(fixed);
        for (int i = 0; i < 9; i++) Py_XDECREF(parts[i]);
    }
done:
    arrow_out_free(&out);
    release_buffers(&buffers);
    return result;
}

/* ---- Index entries of a writer's batch (files.index.IndexFile.put_keys) ------------- */

static inline void put_be32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)(v >> 24);
    p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
}

/* index_put_keys(buf, slots, start, begin_ts, key_hashes, phy_offsets, timestamps)
 *     -> new_slots | None
 *
 * IndexFile.putKey for each key in order, entries numbered from start: the entry (keyHash,
 * phyOffset, timeDiff, prevIndex) first, then its slot, so a reader following a slot
 * always finds a written entry. timeDiff counts from begin_ts, except that when start
 * <= 1 every entry after the first counts from the first key's time (docs/format.md §15 3a).
 * Returns how many keys began a chain (prevIndex 0: the header's hashSlotCount grows by
 * that); the header itself is the caller's. None, with nothing written, when a slot
 * already names an entry about to be written (a kill inside putKey: the Python path
 * repairs that chain) or an entry would fall outside the buffer. key_hashes, phy_offsets
 * and timestamps are native int64s of one length. */
static PyObject *index_put_keys(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError,
                        "index_put_keys takes (buf, slots, start, begin_ts, key_hashes, phy_offsets, timestamps)");
        return NULL;
    }
    long long slots = PyLong_AsLongLong(args[1]);
    long long start = PyLong_AsLongLong(args[2]);
    long long begin_ts = PyLong_AsLongLong(args[3]);
    if (PyErr_Occurred()) return NULL;
    Buffers buffers = {.count = 0};
    Py_ssize_t count, offsets_count, times_count;
    PyObject *result = NULL;
    Py_buffer target;
    if (PyObject_GetBuffer(args[0], &target, PyBUF_WRITABLE) < 0) return NULL;
    const int64_t *hashes = take_buffer(&buffers, args[4], 8, &count);
    const int64_t *offsets = hashes == NULL ? NULL : take_buffer(&buffers, args[5], 8, &offsets_count);
    const int64_t *times = offsets == NULL ? NULL : take_buffer(&buffers, args[6], 8, &times_count);
    if (times == NULL) goto done;
    if (offsets_count != count || times_count != count) {
        PyErr_SetString(PyExc_ValueError, "index_put_keys: the columns differ in length");
        goto done;
    }
    unsigned char *buf = target.buf;
    long long entries_at = INDEX_HEADER_SIZE + slots * INDEX_SLOT_SIZE;
    if (slots <= 0 || start < 0 || entries_at + (start + count) * INDEX_ENTRY_SIZE > target.len) goto slow;
    for (Py_ssize_t i = 0; i < count; i++) {
        if (hashes[i] < 0 || hashes[i] > INT32_MAX) goto slow;
        if ((int32_t)be32(buf + INDEX_HEADER_SIZE + (hashes[i] % slots) * INDEX_SLOT_SIZE) == start + i) goto slow;
    }
    long long chains = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        long long number = start + i;
        unsigned char *slot = buf + INDEX_HEADER_SIZE + (hashes[i] % slots) * INDEX_SLOT_SIZE;
        long long previous = (int32_t)be32(slot);
        if (previous <= 0 || previous > number) previous = 0;
        chains += previous == 0;
        long long begin = i > 0 && start <= 1 ? times[0] : begin_ts;
        long long diff = 0;
        if (begin > 0 && times[i] > begin) {
            diff = (times[i] - begin) / 1000;
            if (diff > INT32_MAX) diff = INT32_MAX;
        }
        unsigned char *entry = buf + entries_at + number * INDEX_ENTRY_SIZE;
        put_be32(entry, (uint32_t)hashes[i]);
        put_be32(entry + 4, (uint32_t)((uint64_t)offsets[i] >> 32));
        put_be32(entry + 8, (uint32_t)offsets[i]);
        put_be32(entry + 12, (uint32_t)diff);
        put_be32(entry + 16, (uint32_t)previous);
        put_be32(slot, (uint32_t)number);
    }
    result = PyLong_FromLongLong(chains);
    goto done;
slow:
    result = Py_NewRef(Py_None);
done:
    release_buffers(&buffers);
    PyBuffer_Release(&target);
    return result;
}

/* ---- The writer's batch screen (writer.validate._plainly_valid) --------------------- */

static inline int ascii_text(PyObject *text) { return PyUnicode_Check(text) && PyUnicode_IS_ASCII(text); }

/* screen_batch(bodies, keys, tags, uniq_keys, queue_ids, max_body, max_keys, max_key_length,
 *              max_tags_length) -> bool
 *
 * True when every message passes the checks of _plainly_valid's Python screen: bodies
 * (bytes) of at most max_body; queue ids None or non-negative ints; at most max_keys keys
 * (a tuple or list) each a non-empty ASCII str of at most max_key_length without \x01,
 * \x02 or a space; TAGS ASCII without \x01 or \x02 and at most max_tags_length long;
 * UNIQ_KEYs empty or ASCII letters and digits, at most 128. False sends the batch to the
 * message-by-message check, which words the first problem (also for a value of an
 * unexpected type). */
static PyObject *screen_batch(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 9) {
        PyErr_SetString(PyExc_TypeError, "screen_batch takes (bodies, keys, tags, uniq_keys, queue_ids, max_body, "
                                         "max_keys, max_key_length, max_tags_length)");
        return NULL;
    }
    Py_ssize_t max_body = PyLong_AsSsize_t(args[5]), max_keys = PyLong_AsSsize_t(args[6]);
    Py_ssize_t max_key_length = PyLong_AsSsize_t(args[7]), max_tags_length = PyLong_AsSsize_t(args[8]);
    if (PyErr_Occurred()) return NULL;
    PyObject *columns[5] = {NULL};
    const char *names[5] = {"bodies", "keys", "tags", "uniq_keys", "queue_ids"};
    int valid = 0;
    for (int c = 0; c < 5; c++) {
        columns[c] = PySequence_Fast(args[c], names[c]);
        if (columns[c] == NULL) goto done;
    }
    Py_ssize_t count = PySequence_Fast_GET_SIZE(columns[0]);
    for (int c = 1; c < 5; c++)
        if (PySequence_Fast_GET_SIZE(columns[c]) != count) goto done;
    PyObject **bodies = PySequence_Fast_ITEMS(columns[0]), **keys = PySequence_Fast_ITEMS(columns[1]);
    PyObject **tags = PySequence_Fast_ITEMS(columns[2]), **uniq_keys = PySequence_Fast_ITEMS(columns[3]);
    PyObject **queue_ids = PySequence_Fast_ITEMS(columns[4]);
    for (Py_ssize_t i = 0; i < count; i++) {
        if (!PyBytes_Check(bodies[i]) || PyBytes_GET_SIZE(bodies[i]) > max_body) goto done;
        if (queue_ids[i] != Py_None) {
            if (!PyLong_Check(queue_ids[i])) goto done;
            int overflow;
            long long queue_id = PyLong_AsLongLongAndOverflow(queue_ids[i], &overflow);
            if (overflow < 0 || (overflow == 0 && queue_id < 0)) goto done;
        }
        PyObject *message_keys = keys[i];
        if (!PyTuple_Check(message_keys) && !PyList_Check(message_keys)) goto done;
        Py_ssize_t key_count = PySequence_Fast_GET_SIZE(message_keys);
        if (key_count > max_keys) goto done;
        PyObject **items = PySequence_Fast_ITEMS(message_keys);
        for (Py_ssize_t k = 0; k < key_count; k++) {
            PyObject *key = items[k];
            if (!ascii_text(key)) goto done;
            Py_ssize_t length = PyUnicode_GET_LENGTH(key);
            if (length == 0 || length > max_key_length) goto done;
            const unsigned char *text = PyUnicode_1BYTE_DATA(key);
            for (Py_ssize_t j = 0; j < length; j++)
                if (text[j] == 0x01 || text[j] == 0x02 || text[j] == ' ') goto done;
        }
        if (!ascii_text(tags[i]) || PyUnicode_GET_LENGTH(tags[i]) > max_tags_length) goto done;
        const unsigned char *tag = PyUnicode_1BYTE_DATA(tags[i]);
        if (memchr(tag, 0x01, PyUnicode_GET_LENGTH(tags[i])) || memchr(tag, 0x02, PyUnicode_GET_LENGTH(tags[i])))
            goto done;
        if (!ascii_text(uniq_keys[i])) goto done;
        Py_ssize_t uniq_length = PyUnicode_GET_LENGTH(uniq_keys[i]);
        if (uniq_length > 128) goto done;
        const unsigned char *uniq = PyUnicode_1BYTE_DATA(uniq_keys[i]);
        for (Py_ssize_t j = 0; j < uniq_length; j++) {
            unsigned char u = uniq[j];
            if (!((u >= '0' && u <= '9') || (u >= 'A' && u <= 'Z') || (u >= 'a' && u <= 'z'))) goto done;
        }
    }
    valid = 1;
done:
    for (int c = 0; c < 5; c++) Py_XDECREF(columns[c]);
    if (PyErr_Occurred()) return NULL;
    return PyBool_FromLong(valid);
}

/* The wire form of SendBatchRequests (protos/rmqstore/v1/writer.proto), for a client that
 * sends messages it holds as columns: each batch is `messages` entries (field 1) followed
 * by compact_results = true (field 2), so the bytes go to gRPC as they are, without a
 * protobuf object per message. Fields are written in field order, empty ones left out,
 * as protobuf's own serializer does. */

static inline Py_ssize_t varint_size(uint64_t value) {
    Py_ssize_t size = 1;
    while (value >= 0x80) {
        value >>= 7;
        size++;
    }
    return size;
}

static inline unsigned char *put_varint(unsigned char *p, uint64_t value) {
    while (value >= 0x80) {
        *p++ = (unsigned char)(value | 0x80);
        value >>= 7;
    }
    *p++ = (unsigned char)value;
    return p;
}

/* A length-delimited field: its size, and with out != NULL its bytes written there. */
static inline Py_ssize_t put_bytes(unsigned char **out, unsigned char tag, const char *data, Py_ssize_t length) {
    if (*out != NULL) {
        unsigned char *p = *out;
        *p++ = tag;
        p = put_varint(p, (uint64_t)length);
        memcpy(p, data, (size_t)length);
        *out = p + length;
    }
    return 1 + varint_size((uint64_t)length) + length;
}

typedef struct {
    PyObject **topics, **queue_ids, **bodies, **keys, **tags, **uniq_keys, **properties;
} MessageColumns;

/* Message i's fields: their size, written to *out when it is not NULL; -1 with an error set. */
static Py_ssize_t message_fields(const MessageColumns *c, Py_ssize_t i, unsigned char **out) {
    Py_ssize_t size = 0, length;
    const char *text = PyUnicode_AsUTF8AndSize(c->topics[i], &length);
    if (text == NULL) return -1;
    if (length) size += put_bytes(out, 0x0A, text, length);
    if (c->queue_ids[i] != Py_None) {
        long long queue_id = PyLong_AsLongLong(c->queue_ids[i]);
        if (queue_id == -1 && PyErr_Occurred()) return -1;
        if (queue_id < INT32_MIN || queue_id > INT32_MAX) {
            PyErr_SetString(PyExc_OverflowError, "a queue id is outside int32");
            return -1;
        }
        uint64_t wire = (uint64_t)(int64_t)queue_id; /* int32 varints sign-extend to 64 bits */
        if (*out != NULL) {
            **out = 0x10;
            *out = put_varint(*out + 1, wire);
        }
        size += 1 + varint_size(wire);
    }
    if (!PyBytes_Check(c->bodies[i])) {
        PyErr_SetString(PyExc_TypeError, "bodies must be bytes");
        return -1;
    }
    if (PyBytes_GET_SIZE(c->bodies[i]))
        size += put_bytes(out, 0x1A, PyBytes_AS_STRING(c->bodies[i]), PyBytes_GET_SIZE(c->bodies[i]));
    PyObject *keys = c->keys[i];
    if (!PyList_Check(keys) && !PyTuple_Check(keys)) {
        PyErr_SetString(PyExc_TypeError, "each message's keys must be a list or tuple");
        return -1;
    }
    PyObject **items = PySequence_Fast_ITEMS(keys);
    for (Py_ssize_t k = 0; k < PySequence_Fast_GET_SIZE(keys); k++) {
        text = PyUnicode_AsUTF8AndSize(items[k], &length);
        if (text == NULL) return -1;
        size += put_bytes(out, 0x22, text, length);
    }
    text = PyUnicode_AsUTF8AndSize(c->tags[i], &length);
    if (text == NULL) return -1;
    if (length) size += put_bytes(out, 0x2A, text, length);
    PyObject *properties = c->properties[i];
    if (properties != Py_None) {
        if (!PyDict_Check(properties)) {
            PyErr_SetString(PyExc_TypeError, "properties must be dicts or None");
            return -1;
        }
        Py_ssize_t position = 0;
        PyObject *name, *value;
        while (PyDict_Next(properties, &position, &name, &value)) {
            Py_ssize_t name_length, value_length;
            const char *name_text = PyUnicode_AsUTF8AndSize(name, &name_length);
            if (name_text == NULL) return -1;
            const char *value_text = PyUnicode_AsUTF8AndSize(value, &value_length);
            if (value_text == NULL) return -1;
            unsigned char *none = NULL;
            Py_ssize_t entry = put_bytes(&none, 0x0A, name_text, name_length) + put_bytes(&none, 0x12, value_text, value_length);
            if (*out != NULL) {
                **out = 0x32;
                *out = put_varint(*out + 1, (uint64_t)entry);
                put_bytes(out, 0x0A, name_text, name_length);
                put_bytes(out, 0x12, value_text, value_length);
            }
            size += 1 + varint_size((uint64_t)entry) + entry;
        }
    }
    text = PyUnicode_AsUTF8AndSize(c->uniq_keys[i], &length);
    if (text == NULL) return -1;
    if (length) size += put_bytes(out, 0x3A, text, length);
    return size;
}

static PyObject *encode_send_batches(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError, "encode_send_batches takes (topics, queue_ids, bodies, keys, tags, "
                                         "uniq_keys, properties, batch_size)");
        return NULL;
    }
    Py_ssize_t batch_size = PyLong_AsSsize_t(args[7]);
    if (batch_size == -1 && PyErr_Occurred()) return NULL;
    if (batch_size < 1) {
        PyErr_SetString(PyExc_ValueError, "batch_size must be at least 1");
        return NULL;
    }
    PyObject *columns[7] = {NULL};
    const char *names[7] = {"topics", "queue_ids", "bodies", "keys", "tags", "uniq_keys", "properties"};
    PyObject *batches = NULL;
    for (int k = 0; k < 7; k++) {
        columns[k] = PySequence_Fast(args[k], names[k]);
        if (columns[k] == NULL) goto done;
    }
    Py_ssize_t count = PySequence_Fast_GET_SIZE(columns[0]);
    for (int k = 1; k < 7; k++)
        if (PySequence_Fast_GET_SIZE(columns[k]) != count) {
            PyErr_SetString(PyExc_ValueError, "the columns differ in length");
            goto done;
        }
    MessageColumns c = {
        PySequence_Fast_ITEMS(columns[0]), PySequence_Fast_ITEMS(columns[1]), PySequence_Fast_ITEMS(columns[2]),
        PySequence_Fast_ITEMS(columns[3]), PySequence_Fast_ITEMS(columns[4]), PySequence_Fast_ITEMS(columns[5]),
        PySequence_Fast_ITEMS(columns[6]),
    };
    batches = PyList_New(0);
    if (batches == NULL) goto done;
    Py_ssize_t *message_sizes = PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)(batch_size));
    if (message_sizes == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t start = 0; start < count; start += batch_size) {
        Py_ssize_t stop = start + batch_size < count ? start + batch_size : count, total = 2; /* compact_results */
        for (Py_ssize_t i = start; i < stop; i++) {
            unsigned char *none = NULL;
            Py_ssize_t size = message_fields(&c, i, &none);
            if (size < 0) {
                PyMem_Free(message_sizes);
                goto fail;
            }
            message_sizes[i - start] = size;
            total += 1 + varint_size((uint64_t)size) + size;
        }
        PyObject *batch = PyBytes_FromStringAndSize(NULL, total);
        if (batch == NULL) {
            PyMem_Free(message_sizes);
            goto fail;
        }
        unsigned char *p = (unsigned char *)PyBytes_AS_STRING(batch);
        for (Py_ssize_t i = start; i < stop; i++) {
            *p++ = 0x0A;
            p = put_varint(p, (uint64_t)message_sizes[i - start]);
            message_fields(&c, i, &p);
        }
        *p++ = 0x10;
        *p++ = 0x01;
        int appended = PyList_Append(batches, batch);
        Py_DECREF(batch);
        if (appended < 0) {
            PyMem_Free(message_sizes);
            goto fail;
        }
    }
    PyMem_Free(message_sizes);
    goto done;
fail:
    Py_CLEAR(batches);
done:
    for (int k = 0; k < 7; k++) Py_XDECREF(columns[k]);
    return batches;
}

/* A SendBatchResponse holding only CompactResults (writer.service.compact_response), as
 * protobuf serializes it: fields in number order, the integer columns packed, int32s
 * sign-extended to ten bytes when negative. Built from the results' columns without a
 * proto object, for a handler whose server sends bytes as they are (add_writer_service).
 * None where a value is not what the columns hold (the caller builds the proto). */

static Py_ssize_t packed_size(PyObject **items, Py_ssize_t count, int is_int32, int *plain) {
    Py_ssize_t size = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        if (!PyLong_CheckExact(items[i])) {
            *plain = 0;
            return 0;
        }
        int overflow;
        long long value = PyLong_AsLongLongAndOverflow(items[i], &overflow);
        if (value == -1 && PyErr_Occurred()) return -1;
        if (overflow || (is_int32 && (value < INT32_MIN || value > INT32_MAX))) {
            *plain = 0;
            return 0;
        }
        size += varint_size((uint64_t)value);
    }
    return size;
}

static unsigned char *put_packed(unsigned char *p, unsigned char tag, PyObject **items, Py_ssize_t count, Py_ssize_t size) {
    if (!count) return p;
    *p++ = tag;
    p = put_varint(p, (uint64_t)size);
    for (Py_ssize_t i = 0; i < count; i++) p = put_varint(p, (uint64_t)PyLong_AsLongLong(items[i]));
    return p;
}

static PyObject *compact_response_bytes(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "compact_response_bytes takes (offset_msg_id_prefix, store_timestamp_ms, "
                                         "uniq_keys, queue_ids, queue_offsets, commitlog_offsets, sizes)");
        return NULL;
    }
    const char *names[5] = {"uniq_keys", "queue_ids", "queue_offsets", "commitlog_offsets", "sizes"};
    PyObject *columns[5] = {NULL}, *result = NULL;
    for (int k = 0; k < 5; k++)
        if ((columns[k] = PySequence_Fast(args[k + 2], names[k])) == NULL) goto done;
    Py_ssize_t prefix_length;
    const char *prefix = PyUnicode_Check(args[0]) ? PyUnicode_AsUTF8AndSize(args[0], &prefix_length) : NULL;
    if (prefix == NULL) {
        if (PyErr_Occurred() && !PyErr_ExceptionMatches(PyExc_UnicodeEncodeError)) goto done;
        PyErr_Clear();
        goto not_plain;
    }
    int overflow;
    long long stored = PyLong_Check(args[1]) ? PyLong_AsLongLongAndOverflow(args[1], &overflow) : 0;
    if (stored == -1 && PyErr_Occurred()) goto done;
    if (!PyLong_Check(args[1]) || overflow) goto not_plain;
    Py_ssize_t size = 0, packed[4], uniq_size = 0;
    unsigned char *measuring = NULL;
    if (prefix_length) size += put_bytes(&measuring, 0x0A, prefix, prefix_length);
    if (stored) size += 1 + varint_size((uint64_t)stored);
    PyObject **uniq_keys = PySequence_Fast_ITEMS(columns[0]);
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(columns[0]); i++) {
        Py_ssize_t length;
        if (!PyUnicode_Check(uniq_keys[i])) goto not_plain;
        const char *text = PyUnicode_AsUTF8AndSize(uniq_keys[i], &length);
        if (text == NULL) {
            if (!PyErr_ExceptionMatches(PyExc_UnicodeEncodeError)) goto done;
            PyErr_Clear();
            goto not_plain;
        }
        uniq_size += 1 + varint_size((uint64_t)length) + length;
    }
    size += uniq_size;
    for (int k = 0; k < 4; k++) {
        int plain = 1;
        packed[k] = packed_size(PySequence_Fast_ITEMS(columns[k + 1]), PySequence_Fast_GET_SIZE(columns[k + 1]),
                                k == 0 || k == 3, &plain);
        if (packed[k] < 0) goto done;
        if (!plain) goto not_plain;
        if (PySequence_Fast_GET_SIZE(columns[k + 1])) size += 1 + varint_size((uint64_t)packed[k]) + packed[k];
    }
    /* SendBatchResponse.compact (field 2), present even when empty, as the proto's is set. */
    result = PyBytes_FromStringAndSize(NULL, 1 + varint_size((uint64_t)size) + size);
    if (result == NULL) goto done;
    unsigned char *p = (unsigned char *)PyBytes_AS_STRING(result);
    *p++ = 0x12;
    p = put_varint(p, (uint64_t)size);
    if (prefix_length) put_bytes(&p, 0x0A, prefix, prefix_length);
    if (stored) {
        *p++ = 0x10;
        p = put_varint(p, (uint64_t)stored);
    }
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(columns[0]); i++) {
        Py_ssize_t length;
        const char *text = PyUnicode_AsUTF8AndSize(uniq_keys[i], &length);
        put_bytes(&p, 0x1A, text, length);
    }
    for (int k = 0; k < 4; k++)
        p = put_packed(p, (unsigned char)(0x22 + 8 * k), PySequence_Fast_ITEMS(columns[k + 1]),
                       PySequence_Fast_GET_SIZE(columns[k + 1]), packed[k]);
    goto done;
not_plain:
    Py_INCREF(Py_None);
    result = Py_None;
done:
    for (int k = 0; k < 5; k++) Py_XDECREF(columns[k]);
    return result;
}

/* A dispatch batch's consume queue units grouped by queue (codec.consumequeue.queue_unit_blocks):
 * for each queue, in the order the batch first names it, (topic, queue id, first queue offset,
 * position of its last record, its units' bytes in record order). None when some queue's
 * offsets do not run consecutively in the batch, or a value does not fit its unit field:
 * the caller then takes the general path. Queues are told apart by topic (a str, compared
 * by value) and queue id, through a table of int64 keys: the topic's number among the
 * batch's distinct topics above the queue id. */

#define CQ_UNIT_SIZE 20 /* consumequeue.py: UNIT, commitLogOffset int64, size int32, tagsCode int64 */

static inline void put_be64(unsigned char *p, long long v) {
    put_be32(p, (uint32_t)((uint64_t)v >> 32));
    put_be32(p + 4, (uint32_t)v);
}

typedef struct {
    int64_t key;
    Py_ssize_t group; /* -1: empty */
} QueueSlot;

typedef struct {
    Py_ssize_t first, last, count;
    long long first_offset, next_offset;
    unsigned char *out;
} QueueGroup;

static int unit_field(PyObject *value, long long low, long long high, long long *out) {
    if (!PyLong_Check(value)) return 0;
    int overflow;
    *out = PyLong_AsLongLongAndOverflow(value, &overflow);
    if (*out == -1 && PyErr_Occurred()) return -1;
    return !overflow && *out >= low && *out <= high;
}

static PyObject *queue_unit_blocks(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "queue_unit_blocks takes (topics, queue_ids, queue_offsets, commitlog_offsets, "
                                         "sizes, tags_codes)");
        return NULL;
    }
    const char *names[6] = {"topics", "queue_ids", "queue_offsets", "commitlog_offsets", "sizes", "tags_codes"};
    PyObject *columns[6] = {NULL}, *topic_numbers = NULL, *result = NULL;
    QueueSlot *slots = NULL;
    QueueGroup *groups = NULL;
    Py_ssize_t *group_of = NULL, group_count = 0;
    for (int k = 0; k < 6; k++)
        if ((columns[k] = PySequence_Fast(args[k], names[k])) == NULL) goto done;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(columns[0]);
    for (int k = 1; k < 6; k++)
        if (PySequence_Fast_GET_SIZE(columns[k]) != count) {
            PyErr_SetString(PyExc_ValueError, "the columns differ in length");
            goto done;
        }
    PyObject **topics = PySequence_Fast_ITEMS(columns[0]), **queue_ids = PySequence_Fast_ITEMS(columns[1]),
             **queue_offsets = PySequence_Fast_ITEMS(columns[2]), **offsets = PySequence_Fast_ITEMS(columns[3]),
             **sizes = PySequence_Fast_ITEMS(columns[4]), **tags_codes = PySequence_Fast_ITEMS(columns[5]);
    Py_ssize_t capacity = 16;
    while (capacity < 2 * count) capacity *= 2;
    slots = PyMem_Malloc(sizeof(QueueSlot) * (size_t)capacity);
    groups = PyMem_Malloc(sizeof(QueueGroup) * (size_t)(count ? count : 1));
    group_of = PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)(count ? count : 1));
    topic_numbers = PyDict_New();
    if (slots == NULL || groups == NULL || group_of == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    if (topic_numbers == NULL) goto done;
    for (Py_ssize_t i = 0; i < capacity; i++) slots[i].group = -1;
    for (Py_ssize_t i = 0; i < count; i++) {
        if (!PyUnicode_CheckExact(topics[i])) goto not_plain;
        long long queue_id, queue_offset;
        int fits = unit_field(queue_ids[i], INT32_MIN, INT32_MAX, &queue_id);
        if (fits == 1) fits = unit_field(queue_offsets[i], 0, (1LL << 62) - 1, &queue_offset);
        if (fits < 0) goto done;
        if (fits == 0) goto not_plain;
        PyObject *number = PyDict_GetItemWithError(topic_numbers, topics[i]);
        long long topic_number;
        if (number == NULL) {
            if (PyErr_Occurred()) goto done;
            topic_number = PyDict_GET_SIZE(topic_numbers);
            PyObject *made = PyLong_FromLongLong(topic_number);
            if (made == NULL) goto done;
            int set = PyDict_SetItem(topic_numbers, topics[i], made);
            Py_DECREF(made);
            if (set < 0) goto done;
        } else {
            topic_number = PyLong_AsLongLong(number);
        }
        int64_t key = (int64_t)((uint64_t)topic_number << 32 | (uint32_t)queue_id);
        Py_ssize_t at = (Py_ssize_t)(((uint64_t)key * 0x9E3779B97F4A7C15ull) >> 20) & (capacity - 1);
        while (slots[at].group >= 0 && slots[at].key != key) at = (at + 1) & (capacity - 1);
        if (slots[at].group < 0) {
            slots[at].key = key;
            slots[at].group = group_count;
            groups[group_count] = (QueueGroup){i, i, 0, queue_offset, queue_offset, NULL};
            group_count++;
        }
        QueueGroup *group = &groups[slots[at].group];
        if (queue_offset != group->next_offset) goto not_plain; /* not consecutive */
        group->next_offset++;
        group->last = i;
        group->count++;
        group_of[i] = slots[at].group;
    }
    result = PyList_New(group_count);
    if (result == NULL) goto done;
    for (Py_ssize_t g = 0; g < group_count; g++) {
        QueueGroup *group = &groups[g];
        PyObject *units = PyBytes_FromStringAndSize(NULL, group->count * CQ_UNIT_SIZE);
        if (units == NULL) goto fail;
        group->out = (unsigned char *)PyBytes_AS_STRING(units);
        PyObject *block = Py_BuildValue("(OOLnN)", topics[group->first], queue_ids[group->first], group->first_offset,
                                        group->last, units);
        if (block == NULL) goto fail;
        PyList_SET_ITEM(result, g, block);
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        long long offset, size, tags_code;
        int fits = unit_field(offsets[i], INT64_MIN, INT64_MAX, &offset);
        if (fits == 1) fits = unit_field(sizes[i], INT32_MIN, INT32_MAX, &size);
        if (fits == 1) fits = unit_field(tags_codes[i], INT64_MIN, INT64_MAX, &tags_code);
        if (fits < 0) goto fail;
        if (fits == 0) {
            Py_CLEAR(result);
            goto not_plain;
        }
        QueueGroup *group = &groups[group_of[i]];
        put_be64(group->out, offset);
        put_be32(group->out + 8, (uint32_t)size);
        put_be64(group->out + 12, tags_code);
        group->out += CQ_UNIT_SIZE;
    }
    goto done;
not_plain:
    Py_INCREF(Py_None);
    result = Py_None;
    goto done;
fail:
    Py_CLEAR(result);
done:
    for (int k = 0; k < 6; k++) Py_XDECREF(columns[k]);
    Py_XDECREF(topic_numbers);
    PyMem_Free(slots);
    PyMem_Free(groups);
    PyMem_Free(group_of);
    return result;
}

/* A serialized SendBatchRequest's messages as the writer's columns (writer.validate.MessageBatch,
 * in its field order: topics, bodies, keys, tags, properties, queue_ids, uniq_keys, flags,
 * born_timestamps_ms, born_hosts), read off the wire in one pass: the proto objects the
 * Python definition (writer.service.to_batch) reads field by field are never made. None
 * wherever the bytes hold anything that definition must word or decide (a born host, which
 * is parsed and may be refused; a field or wire type this reader does not know; bytes that
 * do not parse), and the caller then runs it. Proto3 rules: an absent field is its default,
 * a repeated scalar field's last value wins, optional queue_id is None only when absent. */

typedef struct {
    const unsigned char *p, *end;
} Wire;

static inline int get_varint(Wire *w, uint64_t *value) {
    uint64_t result = 0;
    for (int shift = 0; shift < 64 && w->p < w->end; shift += 7) {
        unsigned char byte = *w->p++;
        result |= (uint64_t)(byte & 0x7F) << shift;
        if (!(byte & 0x80)) {
            *value = result;
            return 1;
        }
    }
    return 0;
}

/* A length-delimited field's bytes: [*data, *data + *length) within w. */
static inline int get_delimited(Wire *w, const unsigned char **data, Py_ssize_t *length) {
    uint64_t size;
    if (!get_varint(w, &size) || size > (uint64_t)(w->end - w->p)) return 0;
    *data = w->p;
    *length = (Py_ssize_t)size;
    w->p += size;
    return 1;
}

/* The few distinct texts a field repeats across a request (a batch's topics and tags), each
 * decoded once: equal texts are then one object, whose hash is computed once and which the
 * dict look-ups downstream find by identity. It owns its references. */
#define TEXT_CACHE_SIZE 16
typedef struct {
    PyObject *texts[TEXT_CACHE_SIZE];
    int count;
} TextCache;

static void text_cache_clear(TextCache *cache) {
    for (int i = 0; i < cache->count; i++) Py_DECREF(cache->texts[i]);
    cache->count = 0;
}

/* A text field's str into *text (its reference replaced), taken from the cache when given
 * one. 1: done; 0: the bytes are not UTF-8 (protobuf's parser refuses them: not plain, no
 * error set); -1: error. */
static int wire_text(const unsigned char *data, Py_ssize_t length, TextCache *cache, PyObject **text) {
    if (cache != NULL)
        for (int i = 0; i < cache->count; i++) {
            PyObject *known = cache->texts[i];
            if (PyUnicode_GET_LENGTH(known) == length && memcmp(PyUnicode_1BYTE_DATA(known), data, (size_t)length) == 0) {
                Py_INCREF(known);
                Py_XSETREF(*text, known);
                return 1;
            }
        }
    PyObject *made = PyUnicode_DecodeUTF8((const char *)data, length, NULL);
    if (made == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) return -1;
        PyErr_Clear();
        return 0;
    }
    /* Only ASCII texts are cached: their bytes are their UTF-8, compared above as is. */
    if (cache != NULL && cache->count < TEXT_CACHE_SIZE && PyUnicode_IS_COMPACT_ASCII(made)) {
        Py_INCREF(made);
        cache->texts[cache->count++] = made;
    }
    Py_XSETREF(*text, made);
    return 1;
}

/* One map<string, string> entry (key = 1, value = 2) into properties. 0: not plain. */
static int wire_property(const unsigned char *data, Py_ssize_t length, PyObject *properties) {
    Wire w = {data, data + length};
    const unsigned char *name = (const unsigned char *)"", *value = (const unsigned char *)"";
    Py_ssize_t name_length = 0, value_length = 0;
    while (w.p < w.end) {
        uint64_t tag;
        if (!get_varint(&w, &tag)) return 0;
        if (tag == 0x0A) {
            if (!get_delimited(&w, &name, &name_length)) return 0;
        } else if (tag == 0x12) {
            if (!get_delimited(&w, &value, &value_length)) return 0;
        } else {
            return 0;
        }
    }
    PyObject *key = NULL, *text = NULL;
    int read = wire_text(name, name_length, NULL, &key);
    if (read == 1) read = wire_text(value, value_length, NULL, &text);
    if (read == 1 && PyDict_SetItem(properties, key, text) < 0) read = -1;
    Py_XDECREF(key);
    Py_XDECREF(text);
    return read;
}

enum { COL_TOPICS, COL_BODIES, COL_KEYS, COL_TAGS, COL_PROPERTIES, COL_QUEUE_IDS, COL_UNIQ_KEYS, COL_FLAGS,
       COL_BORN_TIMESTAMPS, COL_BORN_HOSTS, COLUMNS };

/* One Message's fields appended to the columns. 1: done; 0: not plain (no error set); -1: error. */
static int wire_message(const unsigned char *data, Py_ssize_t length, PyObject **columns, PyObject *empty_properties,
                        TextCache *topic_texts, TextCache *tags_texts, PyObject **previous_properties) {
    Wire w = {data, data + length};
    Py_ssize_t count = PyList_GET_SIZE(columns[COL_TOPICS]);
    PyObject *topic = NULL, *body = NULL, *keys = NULL, *tags = NULL, *properties = NULL, *queue_id = NULL,
             *uniq_key = NULL;
    int32_t flag = 0;
    int64_t born_timestamp_ms = 0;
    int outcome = 0, read;
    keys = PyList_New(0);
    if (keys == NULL) return -1;
    while (w.p < w.end) {
        uint64_t tag, number;
        const unsigned char *field;
        Py_ssize_t field_length;
        if (!get_varint(&w, &tag)) goto done;
        switch (tag) {
        case 0x0A: /* topic */
            if (!get_delimited(&w, &field, &field_length)) goto done;
            if ((read = wire_text(field, field_length, topic_texts, &topic)) != 1) goto failed;
            break;
        case 0x10: /* queue_id: an int32 varint, sign-extended on the wire */
            if (!get_varint(&w, &number)) goto done;
            Py_XSETREF(queue_id, PyLong_FromLong((long)(int32_t)(uint32_t)number));
            if (queue_id == NULL) goto error;
            break;
        case 0x1A: /* body */
            if (!get_delimited(&w, &field, &field_length)) goto done;
            Py_XSETREF(body, PyBytes_FromStringAndSize((const char *)field, field_length));
            if (body == NULL) goto error;
            break;
        case 0x22: { /* keys: repeated */
            if (!get_delimited(&w, &field, &field_length)) goto done;
            PyObject *key = NULL;
            if ((read = wire_text(field, field_length, NULL, &key)) != 1) goto failed;
            int appended = PyList_Append(keys, key);
            Py_DECREF(key);
            if (appended < 0) goto error;
            break;
        }
        case 0x2A: /* tags */
            if (!get_delimited(&w, &field, &field_length)) goto done;
            if ((read = wire_text(field, field_length, tags_texts, &tags)) != 1) goto failed;
            break;
        case 0x32: { /* properties: map entries */
            if (!get_delimited(&w, &field, &field_length)) goto done;
            if (properties == NULL && (properties = PyDict_New()) == NULL) goto error;
            if ((read = wire_property(field, field_length, properties)) != 1) goto failed;
            break;
        }
        case 0x3A: /* uniq_key */
            if (!get_delimited(&w, &field, &field_length)) goto done;
            if ((read = wire_text(field, field_length, NULL, &uniq_key)) != 1) goto failed;
            break;
        case 0x40: /* flag: int32 */
            if (!get_varint(&w, &number)) goto done;
            flag = (int32_t)(uint32_t)number;
            break;
        case 0x48: /* born_timestamp_ms: int64 */
            if (!get_varint(&w, &number)) goto done;
            born_timestamp_ms = (int64_t)number;
            break;
        case 0x52: /* born_host: the Python definition parses (and may refuse) it */
            if (!get_delimited(&w, &field, &field_length)) goto done;
            if (field_length) goto done;
            break;
        default:
            goto done;
        }
    }
    PyObject *message_properties = empty_properties;
    if (properties != NULL && PyDict_GET_SIZE(properties)) {
        /* A run of equal properties shares one mapping, as writer.service._properties_column
         * reads them: a traced producer stamps a request's messages with one trace context,
         * and the screen and the record encoder then work once per distinct mapping. */
        int equal = *previous_properties == NULL ? 0 : PyObject_RichCompareBool(properties, *previous_properties, Py_EQ);
        if (equal < 0) goto error;
        if (!equal) *previous_properties = properties; /* borrowed: the column holds it once appended */
        message_properties = *previous_properties;
    }
    PyObject *values[COLUMNS] = {
        topic, body, keys, tags, message_properties, queue_id, uniq_key, NULL, NULL, Py_None,
    };
    PyObject *made[COLUMNS] = {NULL};
    made[COL_FLAGS] = values[COL_FLAGS] = PyLong_FromLong(flag);
    made[COL_BORN_TIMESTAMPS] = values[COL_BORN_TIMESTAMPS] = PyLong_FromLongLong(born_timestamp_ms);
    if (made[COL_FLAGS] == NULL || made[COL_BORN_TIMESTAMPS] == NULL) {
        Py_XDECREF(made[COL_FLAGS]);
        Py_XDECREF(made[COL_BORN_TIMESTAMPS]);
        goto error;
    }
    if (topic == NULL) values[COL_TOPICS] = made[COL_TOPICS] = PyUnicode_New(0, 0);
    if (body == NULL) values[COL_BODIES] = made[COL_BODIES] = PyBytes_FromStringAndSize(NULL, 0);
    if (tags == NULL) values[COL_TAGS] = made[COL_TAGS] = PyUnicode_New(0, 0);
    if (uniq_key == NULL) values[COL_UNIQ_KEYS] = made[COL_UNIQ_KEYS] = PyUnicode_New(0, 0);
    if (queue_id == NULL) values[COL_QUEUE_IDS] = Py_None;
    outcome = 1;
    for (int k = 0; k < COLUMNS; k++) {
        if (outcome == 1 && (values[k] == NULL || PyList_Append(columns[k], values[k]) < 0)) outcome = -1;
        Py_XDECREF(made[k]);
    }
    if (outcome < 0) {
        /* Keep the columns of equal length: drop what this message appended. */
        for (int k = 0; k < COLUMNS; k++)
            if (PyList_GET_SIZE(columns[k]) > count) PyList_SetSlice(columns[k], count, count + 1, NULL);
    }
    goto done;
failed: /* read is 0 (not plain) or -1 (an error) */
    outcome = read;
    goto done;
error:
    outcome = -1;
done:
    Py_XDECREF(topic);
    Py_XDECREF(body);
    Py_XDECREF(keys);
    Py_XDECREF(tags);
    Py_XDECREF(properties);
    Py_XDECREF(queue_id);
    Py_XDECREF(uniq_key);
    return outcome;
}

/* The request's shared properties given to each message of the properties column: a
 * message with none gets the shared mapping itself; one with its own gets them merged, its
 * own names kept. A run of messages sharing one mapping shares the merged one, as a run of
 * equal properties shares one mapping (wire_message). -1 on an error. */
static int share_properties(PyObject *column, PyObject *empty_properties, PyObject *shared) {
    PyObject *last_own = NULL, *last_merged = NULL; /* borrowed: the column holds them */
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(column); i++) {
        PyObject *own = PyList_GET_ITEM(column, i);
        PyObject *given;
        if (own == empty_properties) {
            given = shared;
            Py_INCREF(given);
        } else if (own == last_own) {
            given = last_merged;
            Py_INCREF(given);
        } else {
            given = PyDict_Copy(shared);
            if (given == NULL || PyDict_Update(given, own) < 0) {
                Py_XDECREF(given);
                return -1;
            }
            last_own = own;
            last_merged = given;
        }
        /* The column's reference to its old item is dropped. last_own may be freed by it
         * once no later item holds it, and is then only compared with items that were
         * alive with it (so never equal to it), never read. */
        PyList_SET_ITEM(column, i, given);
        Py_DECREF(own);
    }
    return 0;
}

static PyObject *send_batch_columns(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "send_batch_columns takes (serialized SendBatchRequest, empty_properties)");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) return NULL;
    PyObject *columns[COLUMNS] = {NULL};
    PyObject *result = NULL;
    TextCache topic_texts = {{NULL}, 0}, tags_texts = {{NULL}, 0};
    PyObject *previous_properties = NULL; /* the last message's with any, held by the column */
    PyObject *shared = NULL;              /* the request's shared_properties, if any */
    for (int k = 0; k < COLUMNS; k++)
        if ((columns[k] = PyList_New(0)) == NULL) goto done;
    Wire w = {view.buf, (const unsigned char *)view.buf + view.len};
    while (w.p < w.end) {
        uint64_t tag, ignored;
        const unsigned char *message;
        Py_ssize_t length;
        if (!get_varint(&w, &tag)) goto plain_none;
        if (tag == 0x0A) { /* messages */
            if (!get_delimited(&w, &message, &length)) goto plain_none;
            int read = wire_message(message, length, columns, args[1], &topic_texts, &tags_texts, &previous_properties);
            if (read < 0) goto done;
            if (read == 0) goto plain_none;
        } else if (tag == 0x10) { /* compact_results: the caller reads it off the request */
            if (!get_varint(&w, &ignored)) goto plain_none;
        } else if (tag == 0x1A) { /* shared_properties: map entries */
            if (!get_delimited(&w, &message, &length)) goto plain_none;
            if (shared == NULL && (shared = PyDict_New()) == NULL) goto done;
            int read = wire_property(message, length, shared);
            if (read < 0) goto done;
            if (read == 0) goto plain_none;
        } else {
            goto plain_none;
        }
    }
    if (shared != NULL && PyDict_GET_SIZE(shared) && share_properties(columns[COL_PROPERTIES], args[1], shared) < 0) goto done;
    result = PyTuple_New(COLUMNS);
    if (result == NULL) goto done;
    for (int k = 0; k < COLUMNS; k++) {
        PyTuple_SET_ITEM(result, k, columns[k]);
        columns[k] = NULL;
    }
    goto done;
plain_none:
    if (!PyErr_Occurred()) {
        Py_INCREF(Py_None);
        result = Py_None;
    }
done:
    for (int k = 0; k < COLUMNS; k++) Py_XDECREF(columns[k]);
    Py_XDECREF(shared);
    text_cache_clear(&topic_texts);
    text_cache_clear(&tags_texts);
    PyBuffer_Release(&view);
    return result;
}

/* The columns of `rmqstore send --file`'s parsed JSON lines (a list of dicts): topics,
 * queue ids, bodies (the text's UTF-8), keys, tags and uniq keys — or None as soon as a
 * line is anything but plain (an unknown or other field, a value of another type, a queue
 * id outside [0, 2^31 − 1]), which the caller then checks line by line to word the error. */

static int field_is(PyObject *name, const char *text, Py_ssize_t length) {
    return PyUnicode_IS_COMPACT_ASCII(name) && PyUnicode_GET_LENGTH(name) == length &&
           memcmp(PyUnicode_1BYTE_DATA(name), text, (size_t)length) == 0;
}

static PyObject *json_columns(PyObject *module, PyObject *documents) {
    if (!PyList_Check(documents)) {
        PyErr_SetString(PyExc_TypeError, "json_columns takes a list");
        return NULL;
    }
    Py_ssize_t count = PyList_GET_SIZE(documents);
    PyObject *columns[6] = {NULL};
    PyObject *empty_text = PyUnicode_FromStringAndSize("", 0), *empty_body = PyBytes_FromStringAndSize("", 0);
    PyObject *result = NULL;
    if (empty_text == NULL || empty_body == NULL) goto done;
    for (int c = 0; c < 6; c++) {
        columns[c] = PyList_New(count);
        if (columns[c] == NULL) goto done;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *document = PyList_GET_ITEM(documents, i);
        if (!PyDict_CheckExact(document)) goto plain_no;
        PyObject *topic = NULL, *queue_id = Py_None, *body = empty_body, *keys = NULL, *tags = empty_text,
                 *uniq_key = empty_text;
        PyObject *name, *value;
        Py_ssize_t position = 0;
        int owned_body = 0;
        while (PyDict_Next(document, &position, &name, &value)) {
            if (!PyUnicode_Check(name)) goto no_line;
            if (field_is(name, "topic", 5)) {
                if (!PyUnicode_CheckExact(value)) goto no_line;
                topic = value;
            } else if (field_is(name, "body", 4)) {
                if (!PyUnicode_CheckExact(value)) goto no_line;
                Py_ssize_t length;
                const char *text = PyUnicode_AsUTF8AndSize(value, &length);
                if (text == NULL) goto failed_line;
                if (owned_body) Py_DECREF(body);
                body = PyBytes_FromStringAndSize(text, length);
                if (body == NULL) goto failed_line;
                owned_body = 1;
            } else if (field_is(name, "keys", 4)) {
                if (!PyList_CheckExact(value)) goto no_line;
                for (Py_ssize_t k = 0; k < PyList_GET_SIZE(value); k++)
                    if (!PyUnicode_CheckExact(PyList_GET_ITEM(value, k))) goto no_line;
                keys = value;
            } else if (field_is(name, "tags", 4)) {
                if (!PyUnicode_CheckExact(value)) goto no_line;
                tags = value;
            } else if (field_is(name, "uniqKey", 7)) {
                if (!PyUnicode_CheckExact(value)) goto no_line;
                uniq_key = value;
            } else if (field_is(name, "queueId", 7)) {
                if (value == Py_None) continue;
                if (!PyLong_CheckExact(value)) goto no_line;
                int overflow;
                long long id = PyLong_AsLongLongAndOverflow(value, &overflow);
                if (overflow || id < 0 || id > INT32_MAX) goto no_line;
                queue_id = value;
            } else {
                goto no_line;
            }
        }
        if (topic == NULL) goto no_line;
        PyObject *row[6] = {topic, queue_id, body, keys, tags, uniq_key};
        for (int c = 0; c < 6; c++) {
            if (c == 3 && keys == NULL) {
                row[3] = PyList_New(0);
                if (row[3] == NULL) goto failed_line;
            } else if (!(c == 2 && owned_body)) {
                Py_INCREF(row[c]);
            }
            PyList_SET_ITEM(columns[c], i, row[c]);
            if (c == 2) owned_body = 0; /* the column holds it now */
        }
        continue;
    no_line:
        if (owned_body) Py_DECREF(body);
        goto plain_no;
    failed_line:
        if (owned_body) Py_DECREF(body);
        goto done;
    }
    result = PyTuple_New(6);
    if (result == NULL) goto done;
    for (int c = 0; c < 6; c++) {
        PyTuple_SET_ITEM(result, c, columns[c]);
        columns[c] = NULL;
    }
    goto done;
plain_no:
    result = Py_None;
    Py_INCREF(result);
done:
    for (int c = 0; c < 6; c++) Py_XDECREF(columns[c]);
    Py_XDECREF(empty_text);
    Py_XDECREF(empty_body);
    return result;
}

/* `rmqstore send --file`'s whole fast path in one pass: the JSON Lines file's bytes straight
 * to serialized SendBatchRequests, with no Python object per message (only the topic text
 * each ack line needs, shared by the messages of one topic). The parse is JSON's grammar
 * restricted to what json_columns accepts: one object a line, its fields among topic, body,
 * keys, tags, uniqKey and queueId, each of the type it takes there, none twice; the values
 * are screened by screen_batch's rules. Anything else — another field, a value of another
 * type, an escape that is not JSON's, bytes that are not UTF-8, an object spanning lines, a
 * message the screen would refuse — answers None, and the caller takes the parse-and-check
 * path, which accepts the same files and words every error. So this parser never decides
 * that a line is bad; it only vouches for lines that are plainly good, and the tests hold
 * its requests to that path's byte for byte. */

typedef struct {
    const char *data; /* into the file, or NULL: at `offset` in the line's scratch buffer */
    Py_ssize_t offset, length;
} Text;

typedef struct {
    char *bytes;
    Py_ssize_t length, capacity;
} Buffer;

static int buffer_reserve(Buffer *buffer, Py_ssize_t more) {
    if (buffer->length + more <= buffer->capacity) return 0;
    Py_ssize_t capacity = buffer->capacity ? buffer->capacity : 4096;
    while (capacity < buffer->length + more) capacity *= 2;
    char *grown = PyMem_Realloc(buffer->bytes, (size_t)capacity);
    if (grown == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    buffer->bytes = grown;
    buffer->capacity = capacity;
    return 0;
}

static inline const char *text_at(const Text *text, const Buffer *scratch) {
    return text->data != NULL ? text->data : scratch->bytes + text->offset;
}

static inline const char *skip_blanks(const char *p, const char *end) {
    while (p < end && (*p == ' ' || *p == '\t' || *p == '\r')) p++;
    return p;
}

static int hex_digit(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static int hex4(const char *p, const char *end) {
    if (end - p < 4) return -1;
    int value = 0;
    for (int i = 0; i < 4; i++) {
        int digit = hex_digit(p[i]);
        if (digit < 0) return -1;
        value = value << 4 | digit;
    }
    return value;
}

/* The length of the well-formed UTF-8 sequence at p (RFC 3629: no overlong forms, no
 * surrogates, nothing above U+10FFFF), or 0. */
static Py_ssize_t utf8_sequence(const unsigned char *p, const unsigned char *end) {
    unsigned char c = p[0];
    if (c >= 0xC2 && c <= 0xDF) return end - p >= 2 && (p[1] & 0xC0) == 0x80 ? 2 : 0;
    if (c >= 0xE0 && c <= 0xEF) {
        if (end - p < 3 || (p[1] & 0xC0) != 0x80 || (p[2] & 0xC0) != 0x80) return 0;
        if (c == 0xE0 && p[1] < 0xA0) return 0; /* overlong */
        if (c == 0xED && p[1] >= 0xA0) return 0; /* a surrogate */
        return 3;
    }
    if (c >= 0xF0 && c <= 0xF4) {
        if (end - p < 4 || (p[1] & 0xC0) != 0x80 || (p[2] & 0xC0) != 0x80 || (p[3] & 0xC0) != 0x80) return 0;
        if (c == 0xF0 && p[1] < 0x90) return 0; /* overlong */
        if (c == 0xF4 && p[1] >= 0x90) return 0; /* above U+10FFFF */
        return 4;
    }
    return 0;
}

static char *put_utf8(char *p, int code_point) {
    if (code_point < 0x80) {
        *p++ = (char)code_point;
    } else if (code_point < 0x800) {
        *p++ = (char)(0xC0 | code_point >> 6);
        *p++ = (char)(0x80 | (code_point & 0x3F));
    } else if (code_point < 0x10000) {
        *p++ = (char)(0xE0 | code_point >> 12);
        *p++ = (char)(0x80 | (code_point >> 6 & 0x3F));
        *p++ = (char)(0x80 | (code_point & 0x3F));
    } else {
        *p++ = (char)(0xF0 | code_point >> 18);
        *p++ = (char)(0x80 | (code_point >> 12 & 0x3F));
        *p++ = (char)(0x80 | (code_point >> 6 & 0x3F));
        *p++ = (char)(0x80 | (code_point & 0x3F));
    }
    return p;
}

/* The JSON string at *at (its opening quote), as UTF-8: a span of the file when it has no
 * escape, else decoded into `scratch`. *at moves past the closing quote. 1, 0 when the
 * string is not plainly valid JSON text, -1 with an error set. */
/* Whether any byte of the 8 in `word` is a quote, a backslash, a control character or
 * not ASCII: what ends a string's plain run (bit tricks over a whole word: a byte is zero
 * in x exactly when the high bit of (x − 0x01…) & ~x is set for it; below 0x20 likewise). */
static inline int plain_run_ends(uint64_t word) {
    const uint64_t ones = 0x0101010101010101ull, highs = 0x8080808080808080ull;
    uint64_t quote = word ^ (ones * '"'), backslash = word ^ (ones * '\\');
    return (((quote - ones) & ~quote) | ((backslash - ones) & ~backslash) | ((word - ones * 0x20) & ~word) | word) &
           highs ? 1 : 0;
}

static int json_string(const char **at, const char *end, Text *out, Buffer *scratch) {
    const char *p = *at + 1, *start = p;
    for (;;) {
        /* Eight bytes at a time while none of them needs a look (a body is mostly such runs). */
        while (end - p >= 8) {
            uint64_t word;
            memcpy(&word, p, 8);
            if (plain_run_ends(word)) break;
            p += 8;
        }
        if (p >= end) return 0;
        unsigned char c = (unsigned char)*p;
        if (c == '"') {
            out->data = start;
            out->offset = 0;
            out->length = p - start;
            *at = p + 1;
            return 1;
        }
        if (c == '\\') break;
        if (c < 0x20) return 0;
        if (c < 0x80) {
            p++;
            continue;
        }
        Py_ssize_t n = utf8_sequence((const unsigned char *)p, (const unsigned char *)end);
        if (n == 0) return 0;
        p += n;
    }
    /* An escape: the text so far, then the rest decoded, into the scratch buffer (at most
     * as long as the source: no escape decodes to more bytes than it is written with). */
    if (buffer_reserve(scratch, end - start) < 0) return -1;
    Py_ssize_t offset = scratch->length;
    char *w = scratch->bytes + offset;
    memcpy(w, start, (size_t)(p - start));
    w += p - start;
    for (;;) {
        if (p >= end) return 0;
        unsigned char c = (unsigned char)*p;
        if (c == '"') break;
        if (c < 0x20) return 0;
        if (c >= 0x80) {
            Py_ssize_t n = utf8_sequence((const unsigned char *)p, (const unsigned char *)end);
            if (n == 0) return 0;
            memcpy(w, p, (size_t)n);
            w += n;
            p += n;
            continue;
        }
        if (c != '\\') {
            *w++ = (char)c;
            p++;
            continue;
        }
        if (end - p < 2) return 0;
        char escaped = p[1];
        p += 2;
        switch (escaped) {
        case '"': *w++ = '"'; break;
        case '\\': *w++ = '\\'; break;
        case '/': *w++ = '/'; break;
        case 'b': *w++ = '\b'; break;
        case 'f': *w++ = '\f'; break;
        case 'n': *w++ = '\n'; break;
        case 'r': *w++ = '\r'; break;
        case 't': *w++ = '\t'; break;
        case 'u': {
            int code_point = hex4(p, end);
            if (code_point < 0) return 0;
            p += 4;
            if (code_point >= 0xDC00 && code_point <= 0xDFFF) return 0; /* a lone low surrogate */
            if (code_point >= 0xD800 && code_point <= 0xDBFF) {
                /* a pair's high half: its low half must follow */
                if (end - p < 6 || p[0] != '\\' || p[1] != 'u') return 0;
                int low = hex4(p + 2, end);
                if (low < 0xDC00 || low > 0xDFFF) return 0;
                p += 6;
                code_point = 0x10000 + ((code_point - 0xD800) << 10) + (low - 0xDC00);
            }
            w = put_utf8(w, code_point); /* at most as many bytes as the escape's 6 (or 12) */
            break;
        }
        default:
            return 0;
        }
    }
    out->data = NULL;
    out->offset = offset;
    out->length = (w - scratch->bytes) - offset;
    scratch->length = offset + out->length;
    *at = p + 1;
    return 1;
}

typedef struct {
    Text topic, body, tags, uniq_key;
    Text *keys; /* room for max_keys */
    Py_ssize_t key_count;
    long queue_id; /* -1: none given */
} JsonMessage;

enum { SEEN_TOPIC = 1, SEEN_BODY = 2, SEEN_KEYS = 4, SEEN_TAGS = 8, SEEN_UNIQ_KEY = 16, SEEN_QUEUE_ID = 32 };

typedef struct {
    Py_ssize_t max_body, max_keys, max_key_length, max_tags_length, max_uniq_key_length;
} Screen;

static inline int text_is(const Text *name, const Buffer *scratch, const char *literal, Py_ssize_t length) {
    return name->length == length && memcmp(text_at(name, scratch), literal, (size_t)length) == 0;
}

/* queueId's value at *at: a JSON integer in [0, 2^31 − 1] (1), or null (1, queue_id -1);
 * 0 for anything else, as json_columns declines other numbers (floats, exponents, negatives). */
static int json_queue_id(const char **at, const char *end, long *queue_id) {
    const char *p = *at;
    if (end - p >= 4 && memcmp(p, "null", 4) == 0) {
        *queue_id = -1;
        *at = p + 4;
        return 1;
    }
    if (p >= end || *p < '0' || *p > '9') return 0;
    if (*p == '0' && p + 1 < end && p[1] >= '0' && p[1] <= '9') return 0; /* a leading zero */
    long value = 0;
    while (p < end && *p >= '0' && *p <= '9') {
        value = value * 10 + (*p - '0');
        if (value > INT32_MAX) return 0;
        p++;
    }
    if (p < end && (*p == '.' || *p == 'e' || *p == 'E')) return 0;
    *queue_id = value;
    *at = p;
    return 1;
}

/* What follows a value of an array or object at *p: 1 after a comma (another value comes,
 * *p at it), 0 after `closer` (*p past it), -1 for anything else. */
static int json_after_value(const char **p, const char *end, char closer) {
    const char *q = skip_blanks(*p, end);
    if (q < end && (*q == ',' || *q == closer)) {
        *p = *q == ',' ? skip_blanks(q + 1, end) : q + 1;
        return *q == ',';
    }
    return -1;
}

/* One line (without its newline) into *message: 1, 0 when it is not a plainly good
 * message, -1 with an error set. */
static int json_message(const char *p, const char *end, JsonMessage *message, Buffer *scratch, const Screen *screen) {
    static const char empty[] = "";
    Text none = {empty, 0, 0};
    message->topic = message->body = message->tags = message->uniq_key = none;
    message->key_count = 0;
    message->queue_id = -1;
    scratch->length = 0;
    int seen = 0, found;
    p = skip_blanks(p, end);
    if (p >= end || *p != '{') return 0;
    p = skip_blanks(p + 1, end);
    if (p < end && *p == '}') return 0; /* no topic */
    for (;;) {
        Text name;
        if (p >= end || *p != '"') return 0;
        if ((found = json_string(&p, end, &name, scratch)) != 1) return found;
        p = skip_blanks(p, end);
        if (p >= end || *p != ':') return 0;
        p = skip_blanks(p + 1, end);
        int field;
        Text *text = NULL;
        if (text_is(&name, scratch, "topic", 5)) field = SEEN_TOPIC, text = &message->topic;
        else if (text_is(&name, scratch, "body", 4)) field = SEEN_BODY, text = &message->body;
        else if (text_is(&name, scratch, "tags", 4)) field = SEEN_TAGS, text = &message->tags;
        else if (text_is(&name, scratch, "uniqKey", 7)) field = SEEN_UNIQ_KEY, text = &message->uniq_key;
        else if (text_is(&name, scratch, "keys", 4)) field = SEEN_KEYS;
        else if (text_is(&name, scratch, "queueId", 7)) field = SEEN_QUEUE_ID;
        else return 0;
        if (seen & field) return 0; /* twice: JSON keeps the last, the slow path shows which */
        seen |= field;
        if (text != NULL) {
            if (p >= end || *p != '"') return 0;
            if ((found = json_string(&p, end, text, scratch)) != 1) return found;
        } else if (field == SEEN_QUEUE_ID) {
            if (!json_queue_id(&p, end, &message->queue_id)) return 0;
        } else {
            if (p >= end || *p != '[') return 0;
            p = skip_blanks(p + 1, end);
            if (p < end && *p == ']') {
                p++;
            } else {
                for (;;) {
                    if (message->key_count == screen->max_keys) return 0;
                    if (p >= end || *p != '"') return 0;
                    if ((found = json_string(&p, end, &message->keys[message->key_count++], scratch)) != 1) return found;
                    if ((found = json_after_value(&p, end, ']')) != 1) break;
                }
                if (found < 0) return 0;
            }
        }
        if ((found = json_after_value(&p, end, '}')) != 1) break;
    }
    if (found < 0) return 0;
    if (skip_blanks(p, end) != end || !(seen & SEEN_TOPIC)) return 0;
    /* screen_batch's rules, on the UTF-8: a text is ASCII when all its bytes are. */
    if (message->body.length > screen->max_body) return 0;
    for (Py_ssize_t k = 0; k < message->key_count; k++) {
        const Text *key = &message->keys[k];
        if (key->length == 0 || key->length > screen->max_key_length) return 0;
        const unsigned char *t = (const unsigned char *)text_at(key, scratch);
        for (Py_ssize_t j = 0; j < key->length; j++)
            if (t[j] >= 0x80 || t[j] == 0x01 || t[j] == 0x02 || t[j] == ' ') return 0;
    }
    if (message->tags.length > screen->max_tags_length) return 0;
    const unsigned char *t = (const unsigned char *)text_at(&message->tags, scratch);
    for (Py_ssize_t j = 0; j < message->tags.length; j++)
        if (t[j] >= 0x80 || t[j] == 0x01 || t[j] == 0x02) return 0;
    if (message->uniq_key.length > screen->max_uniq_key_length) return 0;
    t = (const unsigned char *)text_at(&message->uniq_key, scratch);
    for (Py_ssize_t j = 0; j < message->uniq_key.length; j++) {
        unsigned char u = t[j];
        if (!((u >= '0' && u <= '9') || (u >= 'A' && u <= 'Z') || (u >= 'a' && u <= 'z'))) return 0;
    }
    return 1;
}

/* A length-delimited field of a Text into the buffer (room reserved by the caller). */
static inline char *put_text(char *p, unsigned char tag, const Text *text, const Buffer *scratch) {
    *p++ = (char)tag;
    p = (char *)put_varint((unsigned char *)p, (uint64_t)text->length);
    memcpy(p, text_at(text, scratch), (size_t)text->length);
    return p + text->length;
}

static inline Py_ssize_t text_field_size(const Text *text) {
    return 1 + varint_size((uint64_t)text->length) + text->length;
}

/* The message's fields as message_fields writes them: topic, queue id, body, keys, tags,
 * uniq key; empty ones left out (such a line has no properties). */
static int put_json_message(Buffer *out, const JsonMessage *m, const Buffer *scratch) {
    Py_ssize_t size = text_field_size(&m->topic);
    uint64_t queue_id = (uint64_t)m->queue_id;
    if (m->queue_id >= 0) size += 1 + varint_size(queue_id);
    if (m->body.length) size += text_field_size(&m->body);
    for (Py_ssize_t k = 0; k < m->key_count; k++) size += text_field_size(&m->keys[k]);
    if (m->tags.length) size += text_field_size(&m->tags);
    if (m->uniq_key.length) size += text_field_size(&m->uniq_key);
    if (buffer_reserve(out, 1 + varint_size((uint64_t)size) + size) < 0) return -1;
    char *p = out->bytes + out->length;
    *p++ = 0x0A; /* SendBatchRequest.messages */
    p = (char *)put_varint((unsigned char *)p, (uint64_t)size);
    p = put_text(p, 0x0A, &m->topic, scratch);
    if (m->queue_id >= 0) {
        *p++ = 0x10;
        p = (char *)put_varint((unsigned char *)p, queue_id);
    }
    if (m->body.length) p = put_text(p, 0x1A, &m->body, scratch);
    for (Py_ssize_t k = 0; k < m->key_count; k++) p = put_text(p, 0x22, &m->keys[k], scratch);
    if (m->tags.length) p = put_text(p, 0x2A, &m->tags, scratch);
    if (m->uniq_key.length) p = put_text(p, 0x3A, &m->uniq_key, scratch);
    out->length = p - out->bytes;
    return 0;
}

/* The topic's text: one str per distinct topic, found by its UTF-8 in `topics` (which
 * holds it); the previous line's topic is compared first, as a file's lines often share one. */
static PyObject *topic_text(PyObject *topics, const Text *topic, const Buffer *scratch, PyObject **last_key,
                            PyObject **last_text) {
    const char *data = text_at(topic, scratch);
    if (*last_key != NULL && PyBytes_GET_SIZE(*last_key) == topic->length &&
        memcmp(PyBytes_AS_STRING(*last_key), data, (size_t)topic->length) == 0)
        return *last_text;
    PyObject *key = PyBytes_FromStringAndSize(data, topic->length);
    if (key == NULL) return NULL;
    PyObject *text = PyDict_GetItemWithError(topics, key);
    if (text == NULL) {
        if (PyErr_Occurred() || (text = PyUnicode_DecodeUTF8(data, topic->length, NULL)) == NULL) {
            Py_DECREF(key);
            return NULL;
        }
        int stored = PyDict_SetItem(topics, key, text);
        Py_DECREF(text); /* the dict holds it */
        if (stored < 0) {
            Py_DECREF(key);
            return NULL;
        }
    }
    Py_XSETREF(*last_key, key);
    *last_text = text;
    return text;
}

/* The request in `batch` ended (compact_results = true, then `tail`) and appended to
 * `requests` as bytes; `batch` emptied for the next. -1 on an error. */
static int end_request(Buffer *batch, const char *tail, Py_ssize_t tail_size, PyObject *requests) {
    if (buffer_reserve(batch, 2 + tail_size) < 0) return -1;
    batch->bytes[batch->length++] = 0x10; /* compact_results = true */
    batch->bytes[batch->length++] = 0x01;
    memcpy(batch->bytes + batch->length, tail, (size_t)tail_size);
    batch->length += tail_size;
    PyObject *request = PyBytes_FromStringAndSize(batch->bytes, batch->length);
    int appended = request == NULL ? -1 : PyList_Append(requests, request);
    Py_XDECREF(request);
    batch->length = 0;
    return appended;
}

static PyObject *jsonl_send_batches(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError, "jsonl_send_batches takes (data, batch_size, max_body, max_keys, "
                                         "max_key_length, max_tags_length, max_uniq_key_length, request_tail)");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) return NULL;
    Screen screen;
    Py_ssize_t batch_size = PyLong_AsSsize_t(args[1]);
    screen.max_body = PyLong_AsSsize_t(args[2]);
    screen.max_keys = PyLong_AsSsize_t(args[3]);
    screen.max_key_length = PyLong_AsSsize_t(args[4]);
    screen.max_tags_length = PyLong_AsSsize_t(args[5]);
    screen.max_uniq_key_length = PyLong_AsSsize_t(args[6]);
    PyObject *result = NULL, *requests = NULL, *message_topics = NULL, *topics = NULL, *last_key = NULL, *last_text = NULL;
    Buffer batch = {NULL, 0, 0}, scratch = {NULL, 0, 0};
    JsonMessage message;
    message.keys = NULL;
    if (PyErr_Occurred()) goto done;
    if (batch_size < 1 || screen.max_keys < 0) {
        PyErr_SetString(PyExc_ValueError, "batch_size must be at least 1 and max_keys at least 0");
        goto done;
    }
    if (!PyBytes_Check(args[7])) {
        PyErr_SetString(PyExc_TypeError, "request_tail must be bytes");
        goto done;
    }
    /* Fields written after compact_results in every request (the request's shared
     * properties, serialized). */
    const char *tail = PyBytes_AS_STRING(args[7]);
    Py_ssize_t tail_size = PyBytes_GET_SIZE(args[7]);
    message.keys = PyMem_Malloc(sizeof(Text) * (size_t)(screen.max_keys + 1));
    requests = PyList_New(0);
    message_topics = PyList_New(0);
    topics = PyDict_New();
    if (message.keys == NULL || requests == NULL || message_topics == NULL || topics == NULL) {
        if (!PyErr_Occurred()) PyErr_NoMemory();
        goto done;
    }
    const char *p = view.buf, *end = p + view.len;
    Py_ssize_t in_batch = 0;
    while (p < end) {
        const char *line_end = memchr(p, '\n', (size_t)(end - p));
        if (line_end == NULL) line_end = end;
        if (skip_blanks(p, line_end) != line_end) {
            int found = json_message(p, line_end, &message, &scratch, &screen);
            if (found < 0) goto failed;
            if (found == 0) goto not_plain;
            PyObject *topic = topic_text(topics, &message.topic, &scratch, &last_key, &last_text);
            if (topic == NULL || PyList_Append(message_topics, topic) < 0) goto failed;
            if (put_json_message(&batch, &message, &scratch) < 0) goto failed;
            if (++in_batch == batch_size) {
                if (end_request(&batch, tail, tail_size, requests) < 0) goto failed;
                in_batch = 0;
            }
        }
        if (line_end == end) break;
        p = line_end + 1;
    }
    if (in_batch && end_request(&batch, tail, tail_size, requests) < 0) goto failed;
    if (PyList_GET_SIZE(message_topics) == 0) goto not_plain; /* no message: the slow path words it */
    PyObject *distinct = PyDict_Values(topics);
    if (distinct == NULL) goto failed;
    result = PyTuple_Pack(3, requests, message_topics, distinct);
    Py_DECREF(distinct);
    goto done;
not_plain:
    result = Py_None;
    Py_INCREF(result);
    goto done;
failed:
    result = NULL;
done:
    PyBuffer_Release(&view);
    PyMem_Free(message.keys);
    PyMem_Free(batch.bytes);
    PyMem_Free(scratch.bytes);
    Py_XDECREF(requests);
    Py_XDECREF(message_topics);
    Py_XDECREF(topics);
    Py_XDECREF(last_key);
    return result;
}

/* send --file's ack lines, the text json.dumps would write for each acknowledged message,
 * built into one string instead of a str.format per line. Texts that json.dumps would
 * escape (quotes, backslashes, control or non-ASCII characters) or negative offsets answer
 * None: the caller then formats them in Python, so the output stays the same either way. */
static int plain_json_text(PyObject *text, const char **utf8, Py_ssize_t *size) {
    if (!PyUnicode_Check(text) || !PyUnicode_IS_ASCII(text)) return 0;
    *utf8 = (const char *)PyUnicode_1BYTE_DATA(text);
    *size = PyUnicode_GET_LENGTH(text);
    for (Py_ssize_t i = 0; i < *size; i++) {
        unsigned char c = (unsigned char)(*utf8)[i];
        if (c < 0x20 || c == '"' || c == '\\') return 0;
    }
    return 1;
}

static PyObject *ack_lines(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "ack_lines takes (prefix, topics, uniq_keys, queue_ids, queue_offsets, "
                                         "commitlog_offsets, store_timestamp_ms)");
        return NULL;
    }
    const char *prefix;
    Py_ssize_t prefix_size;
    if (!plain_json_text(args[0], &prefix, &prefix_size)) Py_RETURN_NONE;
    long long stored = PyLong_AsLongLong(args[6]);
    if (stored == -1 && PyErr_Occurred()) return NULL;
    PyObject *columns[5] = {NULL};
    const char *names[5] = {"topics", "uniq_keys", "queue_ids", "queue_offsets", "commitlog_offsets"};
    PyObject *result = NULL;
    char *buffer = NULL;
    for (int k = 0; k < 5; k++) {
        columns[k] = PySequence_Fast(args[k + 1], names[k]);
        if (columns[k] == NULL) goto done;
    }
    /* The lines are as many as the shortest column, as zip() pairs them. */
    Py_ssize_t count = PySequence_Fast_GET_SIZE(columns[0]);
    for (int k = 1; k < 5; k++)
        if (PySequence_Fast_GET_SIZE(columns[k]) < count) count = PySequence_Fast_GET_SIZE(columns[k]);
    size_t capacity = 4096, used = 0;
    buffer = PyMem_Malloc(capacity);
    if (buffer == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        const char *topic, *uniq_key;
        Py_ssize_t topic_size, uniq_key_size;
        if (!plain_json_text(PySequence_Fast_GET_ITEM(columns[0], i), &topic, &topic_size) ||
            !plain_json_text(PySequence_Fast_GET_ITEM(columns[1], i), &uniq_key, &uniq_key_size)) {
            result = Py_NewRef(Py_None);
            goto done;
        }
        long long numbers[3];
        for (int k = 0; k < 3; k++) {
            numbers[k] = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(columns[k + 2], i));
            if (numbers[k] == -1 && PyErr_Occurred()) goto done;
        }
        if (numbers[2] < 0) {
            result = Py_NewRef(Py_None);
            goto done;
        }
        /* The fixed text is under 160 bytes, each of the 4 numbers under 21, the hex 16. */
        size_t needed = used + (size_t)(prefix_size + topic_size + uniq_key_size) + 320;
        if (needed > capacity) {
            while (capacity < needed) capacity *= 2;
            char *grown = PyMem_Realloc(buffer, capacity);
            if (grown == NULL) {
                PyErr_NoMemory();
                goto done;
            }
            buffer = grown;
        }
        char *out = buffer + used;
        out += sprintf(out, "{\"offsetMsgId\": \"");
        memcpy(out, prefix, (size_t)prefix_size);
        out += prefix_size;
        out += sprintf(out, "%016llX\", \"uniqKey\": \"", (unsigned long long)numbers[2]);
        memcpy(out, uniq_key, (size_t)uniq_key_size);
        out += uniq_key_size;
        out += sprintf(out, "\", \"topic\": \"");
        memcpy(out, topic, (size_t)topic_size);
        out += topic_size;
        out += sprintf(out, "\", \"queueId\": %lld, \"queueOffset\": %lld, \"commitLogOffset\": %lld, \"storeTimestamp\": %lld}\n",
                       numbers[0], numbers[1], numbers[2], stored);
        used = (size_t)(out - buffer);
    }
    result = PyUnicode_DecodeASCII(buffer, (Py_ssize_t)used, NULL);
done:
    PyMem_Free(buffer);
    for (int k = 0; k < 5; k++) Py_XDECREF(columns[k]);
    return result;
}

static PyMethodDef methods[] = {
    {"java_string_hash", (PyCFunction)java_string_hash, METH_O, "String.hashCode of a str, as a signed int32."},
    {"index_key_hash", (PyCFunction)(void (*)(void))index_key_hash, METH_FASTCALL,
     "index_key_hash(topic, key): IndexFile.indexKeyHashMethod of topic#key."},
    {"matching_offsets", (PyCFunction)(void (*)(void))matching_offsets, METH_FASTCALL,
     "matching_offsets(buf, slots, entries, key_hash, number, steps, max_count) -> (offsets, number, steps) | None."},
    {"configure", (PyCFunction)(void (*)(void))configure, METH_FASTCALL,
     "configure(Record, address, slot names | None): what decode_record builds records with."},
    {"decode_record", (PyCFunction)(void (*)(void))decode_record, METH_FASTCALL,
     "decode_record(buf, pos, check_crc, end) -> Record | None."},
    {"read_records", (PyCFunction)(void (*)(void))read_records, METH_FASTCALL,
     "read_records(fd, positions, file_size, start_offset, read_ahead, check_crc, match) -> list[Record | None | False]."},
    {"first_stored_after", (PyCFunction)(void (*)(void))first_stored_after, METH_FASTCALL,
     "first_stored_after(units, lo, hi, timestamp, strict, fd, file_start, file_size) -> int | None."},
    {"walk_starts", (PyCFunction)(void (*)(void))walk_starts, METH_FASTCALL,
     "walk_starts(buf, position, limit, rows_max) -> (starts, position)."},
    {"body_crcs", (PyCFunction)(void (*)(void))body_crcs, METH_FASTCALL,
     "body_crcs(data, at, length) -> bytes of native int64 CRCs."},
    {"span_texts", (PyCFunction)(void (*)(void))span_texts, METH_FASTCALL,
     "span_texts(data, at, length) -> list[str | None]."},
    {"span_key_hashes", (PyCFunction)(void (*)(void))span_key_hashes, METH_FASTCALL,
     "span_key_hashes(data, prefixes, uniq_at, uniq_length, keys_at, keys_length) -> (hashes, counts) | None."},
    {"property_pairs", (PyCFunction)(void (*)(void))property_pairs, METH_FASTCALL,
     "property_pairs(data, at, length) -> (pair_ends, name_at, name_length, value_at, value_length, keys, tags, "
     "uniq_key, repeated)."},
    {"arrow_columns", (PyCFunction)(void (*)(void))arrow_columns, METH_FASTCALL,
     "arrow_columns(buf, starts, base_offset, check_crc, allocate) -> (rows, bad, fixed, msg_id, topic, born_host, "
     "store_host, body, properties, named) | None."},
    {"tags_codes", (PyCFunction)tags_codes, METH_O, "tags_codes(tags) -> list[int]."},
    {"message_key_hashes", (PyCFunction)(void (*)(void))message_key_hashes, METH_FASTCALL,
     "message_key_hashes(prefixes, uniq_keys, keys) -> (hashes, counts)."},
    {"encode_common_properties", (PyCFunction)(void (*)(void))encode_common_properties, METH_FASTCALL,
     "encode_common_properties(order, keys, tags, uniq_keys[, pieces]) -> list[bytes]."},
    {"index_put_keys", (PyCFunction)(void (*)(void))index_put_keys, METH_FASTCALL,
     "index_put_keys(buf, slots, start, begin_ts, key_hashes, phy_offsets, timestamps) -> new_slots | None."},
    {"json_columns", (PyCFunction)json_columns, METH_O,
     "json_columns(documents) -> (topics, queue_ids, bodies, keys, tags, uniq_keys) | None."},
    {"encode_send_batches", (PyCFunction)(void (*)(void))encode_send_batches, METH_FASTCALL,
     "encode_send_batches(topics, queue_ids, bodies, keys, tags, uniq_keys, properties, batch_size) -> list[bytes]:"
     " serialized SendBatchRequests asking for compact results."},
    {"jsonl_send_batches", (PyCFunction)(void (*)(void))jsonl_send_batches, METH_FASTCALL,
     "jsonl_send_batches(data, batch_size, max_body, max_keys, max_key_length, max_tags_length, max_uniq_key_length,"
     " request_tail) -> (requests, topics, distinct_topics) | None: send --file's requests straight from the file."},
    {"ack_lines", (PyCFunction)(void (*)(void))ack_lines, METH_FASTCALL,
     "ack_lines(prefix, topics, uniq_keys, queue_ids, queue_offsets, commitlog_offsets, store_timestamp_ms) -> str"
     " | None: send --file's ack lines, None where one needs Python's formatting."},
    {"compact_response_bytes", (PyCFunction)(void (*)(void))compact_response_bytes, METH_FASTCALL,
     "compact_response_bytes(prefix, store_timestamp_ms, uniq_keys, queue_ids, queue_offsets, commitlog_offsets, sizes)"
     " -> bytes | None: a serialized SendBatchResponse holding only CompactResults."},
    {"queue_unit_blocks", (PyCFunction)(void (*)(void))queue_unit_blocks, METH_FASTCALL,
     "queue_unit_blocks(topics, queue_ids, queue_offsets, commitlog_offsets, sizes, tags_codes)"
     " -> [(topic, queue_id, first_queue_offset, last_position, units)] | None."},
    {"send_batch_columns", (PyCFunction)(void (*)(void))send_batch_columns, METH_FASTCALL,
     "send_batch_columns(request_bytes, empty_properties) -> (topics, ..., born_hosts) | None."},
    {"screen_batch", (PyCFunction)(void (*)(void))screen_batch, METH_FASTCALL,
     "screen_batch(bodies, keys, tags, uniq_keys, queue_ids, max_body, max_keys, max_key_length, max_tags_length)"
     " -> bool."},
    {"encode_records", (PyCFunction)(void (*)(void))encode_records, METH_FASTCALL,
     "encode_records(first_offset, queue_ids, flags, queue_offsets, born_timestamps_ms, born_hosts, bodies, "
     "topics, properties, store_timestamp_ms, store_host, now_ms) -> (bytes, sizes)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_speedups", "Compiled fast paths of rmqstore's codecs.", -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__speedups(void) {
    name_keys = PyUnicode_InternFromString("KEYS");
    name_tags = PyUnicode_InternFromString("TAGS");
    name_uniq_key = PyUnicode_InternFromString("UNIQ_KEY");
    if (name_keys == NULL || name_tags == NULL || name_uniq_key == NULL) return NULL;
    crc_init();
    return PyModule_Create(&module_def);
}
