/* Arrow columns of walked records (pipeline/columns.py). */
#include "speedups.h"

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
PyObject *arrow_columns(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
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
