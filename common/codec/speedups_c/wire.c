/* The protobuf wire form of send requests and compact responses. */
#include "speedups.h"

/* The wire form of SendBatchRequests (protos/rmqstore/v1/writer.proto), for a client that
 * sends messages it holds as columns: each batch is `messages` entries (field 1) followed
 * by compact_results = true (field 2), so the bytes go to gRPC as they are, without a
 * protobuf object per message. Fields are written in field order, empty ones left out,
 * as protobuf's own serializer does. */

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

PyObject *encode_send_batches(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
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

PyObject *compact_response_bytes(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
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

PyObject *send_batch_columns(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
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
