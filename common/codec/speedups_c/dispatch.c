/* Dispatch plans: topics, tags codes and index key hashes of a batch (dispatch.py). */
#include "speedups.h"

/* ---- Dispatch plans over bulk-decoded records (dispatch.DispatchBatch.of_columns) --- */

/* span_texts(data, at, length) -> list[str | None]: data[at:at+length] decoded as UTF-8
 * ("replace") for each span, None where at is negative. Spans repeat (topics, tags): the
 * distinct texts of the call are shared. */
PyObject *span_texts(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (!arity(nargs, 3, "span_texts takes (data, at, length)")) return NULL;
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
        } else if (length[row] < 0 || at[row] > size - length[row]) {
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

/* The (hashes, counts) a key-hash call returns, hashes cut to its first emitted int64s;
 * NULL with an error set. */
static PyObject *hashes_and_counts(PyObject **hashes, PyObject *counts, Py_ssize_t emitted) {
    if (_PyBytes_Resize(hashes, emitted * 8) < 0) return NULL;
    return PyTuple_Pack(2, *hashes, counts);
}

/* result, once a key-hash call has let go of what it held. */
static PyObject *released(PyObject *result, PyObject *hashes, PyObject *counts, Buffers *buffers) {
    Py_XDECREF(hashes);
    Py_XDECREF(counts);
    release_buffers(buffers);
    return result;
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
PyObject *span_key_hashes(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (!arity(nargs, 6, "span_key_hashes takes (data, prefixes, uniq_at, uniq_length, keys_at, keys_length)")) return NULL;
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
            if (n < 0 || a > size - n) {
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
    result = hashes_and_counts(&hashes, counts, emitted);
done:
    return released(result, hashes, counts, &buffers);
}

/* ---- Dispatch plans of a writer's batch (dispatch.DispatchBatch.of_messages) -------- */

/* tags_codes(tags) -> list[int]: consumequeue.tags_code of each: String.hashCode of the
 * whole TAGS value, 0 when it is None or empty. */
PyObject *tags_codes(PyObject *module, PyObject *tags) {
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
PyObject *message_key_hashes(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
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
    result = hashes_and_counts(&hashes, counts, emitted);
done:
    return released(result, hashes, counts, &buffers);
}
