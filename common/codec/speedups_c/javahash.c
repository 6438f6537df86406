/* Java's String.hashCode and the index's key hash (javahash.py). */
#include "speedups.h"

/* ---- String.hashCode ---------------------------------------------------------------- */

/* h = 31*h + unit over the UTF-16 code units of text (mod 2^32), continuing from h. */
uint32_t hash_units(uint32_t h, PyObject *text) {
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

PyObject *java_string_hash(PyObject *module, PyObject *text) {
    if (!PyUnicode_Check(text)) {
        PyErr_SetString(PyExc_TypeError, "java_string_hash takes a str");
        return NULL;
    }
    return PyLong_FromLong((int32_t)hash_units(0, text));
}

/* IndexFile.indexKeyHashMethod of "topic#key": |hashCode|, Integer.MIN_VALUE as 0. */
PyObject *index_key_hash(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
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
