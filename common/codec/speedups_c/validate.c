/* The writer's batch screen (common/message_rules.py). */
#include "speedups.h"

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
PyObject *screen_batch(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (!arity(nargs, 9, "screen_batch takes (bodies, keys, tags, uniq_keys, queue_ids, max_body, max_keys, "
                         "max_key_length, max_tags_length)"))
        return NULL;
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
