/* Index files: a key's slot chain, and a batch's entries (files/index.py). */
#include "speedups.h"

/* ---- Index chains ------------------------------------------------------------------- */

/* matching_offsets(buf, slots, entries, key_hash, number, steps, max_count)
 *     -> (offsets, number, steps) | None
 *
 * The phyOffsets along the key's slot chain whose hash is key_hash, newest first, with
 * Apache's stop rules, at most max_count of them per call: number 0 starts at the slot;
 * the number and steps returned resume the walk (number 0: the chain ended). None if
 * the chain leads outside the buffer. */
/* Whether entry number lies wholly inside the length bytes of an index whose entries start
 * at entries_at (at most length + INDEX_HEADER_SIZE). */
static inline int entry_inside(long long entries_at, long long number, Py_ssize_t length) {
    return number >= 0 && entries_at <= length && number < (length - entries_at) / INDEX_ENTRY_SIZE;
}

PyObject *matching_offsets(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (!arity(nargs, 7, "matching_offsets takes (buf, slots, entries, key_hash, number, steps, max_count)")) return NULL;
    long long slots, entries, key_hash, number, steps;
    if (!long_long_args(args + 1, 5, &slots, &entries, &key_hash, &number, &steps)) return NULL;
    Py_ssize_t max_count = PyLong_AsSsize_t(args[6]);
    if (max_count == -1 && PyErr_Occurred()) return NULL;
    if (slots <= 0 || key_hash < 0 || number < 0 || steps < 0 || max_count < 1) Py_RETURN_NONE;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) return NULL;
    const unsigned char *buf = view.buf;
    Py_ssize_t length = view.len;
    PyObject *found = NULL, *result = NULL;
    if (slots > length / INDEX_SLOT_SIZE) goto slow;
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
        if (!entry_inside(entries_at, number, length)) goto slow;
        const unsigned char *entry = buf + entries_at + number * INDEX_ENTRY_SIZE;
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

/* ---- Index entries of a writer's batch (files.index.IndexFile.put_keys) ------------- */

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
PyObject *index_put_keys(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (!arity(nargs, 7, "index_put_keys takes (buf, slots, start, begin_ts, key_hashes, phy_offsets, timestamps)")) return NULL;
    long long slots, start, begin_ts;
    if (!long_long_args(args + 1, 3, &slots, &start, &begin_ts)) return NULL;
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
    if (slots <= 0 || slots > target.len / INDEX_SLOT_SIZE || start < 0) goto slow;
    long long entries_at = INDEX_HEADER_SIZE + slots * INDEX_SLOT_SIZE;
    long long room = entries_at <= target.len ? (target.len - entries_at) / INDEX_ENTRY_SIZE : -1; /* entries */
    if (start > room || count > room - start) goto slow;
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
        put_be64(entry + 4, (uint64_t)offsets[i]);
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
