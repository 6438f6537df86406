/* Consume queues: the time search, and a batch's units grouped by queue (files/consumequeue.py, consumequeue.py). */
#include "speedups.h"

/* ---- Time search ------------------------------------------------------------------- */

#define STORE_TIME_HEADER_MAX (PREFIX_SIZE + 20 + 8) /* … BORNHOST (IPv6 at most), STORETIMESTAMP */

/* first_stored_after(units, lo, hi, timestamp, strict, fd, file_start, file_size) -> int | None
 *
 * ConsumeQueue.offset_by_time's bisection over units [lo, hi) of one consume queue file's
 * bytes: the first unit whose record was stored at or after timestamp (after it when
 * strict), hi if none. Each probe reads the record's header with pread from the one commit
 * log file that holds the records of all these units (its descriptor, first offset and
 * size) and takes STORETIMESTAMP as record.store_timestamp_at does. None when a probed
 * unit is a filler, points outside that file or at no record header: the caller's Python
 * bisection then reads that unit and says what is wrong. */
/* The store time of the record that the unit at `unit` points at, read with pread from the
 * commit log file (fd, file_start, file_size) into *stored: 1, or 0 when the unit is a
 * filler, points outside that file or at no record header. */
static int unit_store_time(const unsigned char *unit, int fd, long long file_start, long long file_size, int64_t *stored) {
    unsigned char header[STORE_TIME_HEADER_MAX];
    if (be32(unit + 8) == CQ_FILLER_SIZE) return 0; /* a filler, or a torn unit */
    long long offset = be64(unit);
    if (offset < file_start || offset - file_start >= file_size) return 0;
    long long position = offset - file_start;
    long long wanted = file_size - position < STORE_TIME_HEADER_MAX ? file_size - position : STORE_TIME_HEADER_MAX;
    ssize_t got = pread(fd, header, (size_t)wanted, (off_t)position);
    if (got < OFFSET_SYSFLAG + 4) return 0;
    long long size = (int32_t)be32(header);
    uint32_t magic = be32(header + 4);
    if (magic != MAGIC_V1 && magic != MAGIC_V2) return 0;
    long long at = PREFIX_SIZE + ((be32(header + OFFSET_SYSFLAG) & BORNHOST_V6) ? 20 : 8);
    if (at + 8 > size || at + 8 > got) return 0;
    *stored = (int64_t)be64(header + at);
    return 1;
}

static int log_file_args(PyObject *const *args, long long *fd, long long *file_start, long long *file_size,
                         const char *name) {
    if (!long_long_args(args, 3, fd, file_start, file_size)) return 0;
    if (*fd < INT_MIN || *fd > INT_MAX || *file_start < 0 || *file_size < 0) {
        PyErr_Format(PyExc_ValueError, "%s: fd, file_start or file_size out of range", name);
        return 0;
    }
    return 1;
}

PyObject *first_stored_after(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (!arity(nargs, 8, "first_stored_after takes (units, lo, hi, timestamp, strict, fd, file_start, file_size)")) return NULL;
    long long low, high, timestamp, fd, file_start, file_size;
    if (!long_long_args(args + 1, 3, &low, &high, &timestamp)) return NULL;
    int strict = PyObject_IsTrue(args[4]);
    if (strict < 0 || !log_file_args(args + 5, &fd, &file_start, &file_size, "first_stored_after")) return NULL;
    Py_buffer units;
    if (PyObject_GetBuffer(args[0], &units, PyBUF_SIMPLE) < 0) return NULL;
    PyObject *result = NULL;
    if (low < 0 || high < low || high > units.len / CQ_UNIT_SIZE) {
        PyErr_SetString(PyExc_ValueError, "first_stored_after: the range is outside the units");
        goto done;
    }
    const unsigned char *base = units.buf;
    while (low < high) {
        long long mid = low + (high - low) / 2;
        int64_t stored;
        if (!unit_store_time(base + mid * CQ_UNIT_SIZE, (int)fd, file_start, file_size, &stored)) {
            result = Py_NewRef(Py_None);
            goto done;
        }
        if (strict ? stored > timestamp : stored >= timestamp)
            high = mid;
        else
            low = mid + 1;
    }
    result = PyLong_FromLongLong(low);
done:
    PyBuffer_Release(&units);
    return result;
}

/* store_times(units, lo, hi, fd, file_start, file_size, out) -> int
 *
 * query.timeindex's read of a queue's store times: for units [lo, hi) of one consume
 * queue file's bytes, the store time of each unit's record (read as first_stored_after
 * reads it) into out[unit - lo], a writable buffer of native int64s. Returns how many
 * units from lo it read: it stops at the first unit that is a filler, points outside the
 * commit log file or at no record header (the caller reads that one in Python, which says
 * what is wrong, or goes on in the log's next file). */
PyObject *store_times(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (!arity(nargs, 7, "store_times takes (units, lo, hi, fd, file_start, file_size, out)")) return NULL;
    long long low, high, fd, file_start, file_size;
    if (!long_long_args(args + 1, 2, &low, &high) || !log_file_args(args + 3, &fd, &file_start, &file_size, "store_times"))
        return NULL;
    Py_buffer units, out;
    if (PyObject_GetBuffer(args[0], &units, PyBUF_SIMPLE) < 0) return NULL;
    if (PyObject_GetBuffer(args[6], &out, PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&units);
        return NULL;
    }
    PyObject *result = NULL;
    if (low < 0 || high < low || high > units.len / CQ_UNIT_SIZE) {
        PyErr_SetString(PyExc_ValueError, "store_times: the range is outside the units");
        goto done;
    }
    if ((high - low) > out.len / (Py_ssize_t)sizeof(int64_t)) {
        PyErr_SetString(PyExc_ValueError, "store_times: out holds fewer int64s than the range has units");
        goto done;
    }
    const unsigned char *base = units.buf;
    unsigned char *into = out.buf;
    long long unit = low;
    for (; unit < high; unit++) {
        int64_t stored;
        if (!unit_store_time(base + unit * CQ_UNIT_SIZE, (int)fd, file_start, file_size, &stored)) break;
        memcpy(into + (unit - low) * sizeof(int64_t), &stored, sizeof(int64_t));
    }
    result = PyLong_FromLongLong(unit - low);
done:
    PyBuffer_Release(&out);
    PyBuffer_Release(&units);
    return result;
}

/* A dispatch batch's consume queue units grouped by queue (codec.consumequeue.queue_unit_blocks):
 * for each queue, in the order the batch first names it, (topic, queue id, first queue offset,
 * position of its last record, its units' bytes in record order). None when some queue's
 * offsets do not run consecutively in the batch, or a value does not fit its unit field:
 * the caller then takes the general path. Queues are told apart by topic (a str, compared
 * by value) and queue id, through a table of int64 keys: the topic's number among the
 * batch's distinct topics above the queue id. */

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

PyObject *queue_unit_blocks(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (!arity(nargs, 6, "queue_unit_blocks takes (topics, queue_ids, queue_offsets, commitlog_offsets, sizes, tags_codes)"))
        return NULL;
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
        put_be64(group->out, (uint64_t)offset);
        put_be32(group->out + 8, (uint32_t)size);
        put_be64(group->out + 12, (uint64_t)tags_code);
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
