/* Int64 columns, borrowed from a caller's buffers or grown and returned as bytes; integer
 * arguments. */
#include "speedups.h"

int column_push(Column *column, int64_t value) {
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

PyObject *column_bytes(const Column *column) {
    return PyByteArray_FromStringAndSize((const char *)column->items, column->count * (Py_ssize_t)sizeof(int64_t));
}

void release_buffers(Buffers *buffers) {
    for (int i = 0; i < buffers->count; i++) PyBuffer_Release(&buffers->views[i]);
    buffers->count = 0;
}

/* The buffer of args[i], which must hold whole int64s (or bytes when item is 1). */
const void *take_buffer(Buffers *buffers, PyObject *object, Py_ssize_t item, Py_ssize_t *items) {
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

int long_long_args(PyObject *const *args, int count, ...) {
    va_list out;
    va_start(out, count);
    int converted = 1;
    for (int i = 0; i < count && converted; i++) {
        long long *value = va_arg(out, long long *);
        *value = PyLong_AsLongLong(args[i]);
        converted = !(*value == -1 && PyErr_Occurred());
    }
    va_end(out);
    return converted;
}
