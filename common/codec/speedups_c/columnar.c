/* Walking records in bulk and their bodies' CRCs (columnar.py). */
#include "speedups.h"

/* ---- Walking and checking records in bulk (codec.columnar) -------------------------- */

enum { PREFETCH_BYTES = 4096 };

/* walk_starts(buf, position, limit, rows_max) -> (starts, position): record starts from
 * position on while a header passes (v1/v2 magic, a size of at least the smallest
 * record's that fits the buffer) and the next start is before limit; columnar.walk's
 * loop, which then says why it ended. starts: a bytearray of native int64s. */
PyObject *walk_starts(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (!arity(nargs, 4, "walk_starts takes (buf, position, limit, rows_max)")) return NULL;
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

/* body_crcs(data, at, length) -> bytes: UtilAll.crc32 of each body data[at:at+length]
 * (zlib's CRC-32 & 0x7FFFFFFF, 0 for an empty body), as native int64s; at and length
 * are int64 buffers. */
PyObject *body_crcs(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (!arity(nargs, 3, "body_crcs takes (data, at, length)")) return NULL;
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
        if (ats[i] < 0 || lengths[i] < 0 || ats[i] > data.len - lengths[i]) {
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
