/* Message properties: decoding, encoding a batch's common ones, and their pairs in bulk (properties.py, columnar.py). */
#include "speedups.h"

/* The property names nearly every record has, shared instead of decoded each time. */
static PyObject *name_keys = NULL, *name_tags = NULL, *name_uniq_key = NULL;

int properties_init(void) {
    name_keys = PyUnicode_InternFromString("KEYS");
    name_tags = PyUnicode_InternFromString("TAGS");
    name_uniq_key = PyUnicode_InternFromString("UNIQ_KEY");
    return name_keys == NULL || name_tags == NULL || name_uniq_key == NULL ? -1 : 0;
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
PyObject *decode_properties(const unsigned char *p, Py_ssize_t n) {
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

/* encode_common_properties(order, keys, tags, uniq_keys[, pieces]) -> list[bytes]
 *
 * properties.encode_messages_properties for messages with KEYS (a list of str, joined
 * with spaces), TAGS and UNIQ_KEY: "name 0x01 value" joined by 0x02, the names in broker
 * order, given as positions in (KEYS, TAGS, UNIQ_KEY). Without pieces the message has
 * no properties of its own; with pieces (four bytes) it has the same ones as every other
 * message, and each message is pieces[0] value pieces[1] value pieces[2] value pieces[3],
 * the values in that order (the pieces hold every name, separator and shared value). */
PyObject *encode_common_properties(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
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
PyObject *property_pairs(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (!arity(nargs, 3, "property_pairs takes (data, at, length)")) return NULL;
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
        if (at[row] < 0 || length[row] < 0 || at[row] > size - length[row]) {
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
