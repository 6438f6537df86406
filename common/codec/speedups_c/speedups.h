/*
 * The shared declarations of rmqstore.common.codec._speedups, one extension built from
 * the .c files beside this header (setup.py lists them): the format's layouts and
 * byte-order helpers, the helpers more than one file uses, and each file's entry points,
 * which module.c puts in the module's method table.
 *
 * Layouts: docs/format.md §3 (records) and §7 (index files), declared with their offsets in
 * record.py and index.py; all integers big-endian.
 */
#ifndef RMQSTORE_SPEEDUPS_H
#define RMQSTORE_SPEEDUPS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdarg.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

/* record.py */
#define MAGIC_V1 0xDAA320A7u
#define MAGIC_V2 0xDAA320ABu
#define OFFSET_SYSFLAG 36
#define PREFIX_SIZE 48 /* TOTALSIZE … BORNTIMESTAMP */
#define BORNHOST_V6 0x10
#define STOREHOST_V6 0x20
/* calMsgLength with IPv4 hosts and nothing variable: 74 + L + 8 + 8 */
#define MINIMUM_SIZE_V1 91
#define MINIMUM_SIZE_V2 92
/* commitlog.py: READ_THROUGH_FILE_RECORD_BYTES_MAX */
#define READ_THROUGH_RECORD_BYTES_MAX (16 * 1024 * 1024)

/* index.py */
#define INDEX_HEADER_SIZE 40
#define INDEX_OFFSET_INDEX_COUNT 36
#define INDEX_SLOT_SIZE 4
#define INDEX_ENTRY_SIZE 20

/* consumequeue.py: UNIT, commitLogOffset int64, size int32, tagsCode int64 */
#define CQ_UNIT_SIZE 20
#define CQ_FILLER_SIZE 0x7FFFFFFFu

static inline uint32_t be32(const unsigned char *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

static inline int64_t be64(const unsigned char *p) { return (int64_t)((uint64_t)be32(p) << 32 | be32(p + 4)); }

static inline int16_t be16(const unsigned char *p) { return (int16_t)((uint16_t)p[0] << 8 | (uint16_t)p[1]); }

static inline void put_be32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)(v >> 24);
    p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
}

static inline void put_be64(unsigned char *p, uint64_t v) {
    put_be32(p, (uint32_t)(v >> 32));
    put_be32(p + 4, (uint32_t)v);
}

/* ---- Shared helpers ------------------------------------------------------------------ */

/* Whether a call got the count of arguments it takes; else a TypeError quoting signature. */
static inline int arity(Py_ssize_t nargs, Py_ssize_t expected, const char *signature) {
    if (nargs == expected) return 1;
    PyErr_SetString(PyExc_TypeError, signature);
    return 0;
}

/* buffers.c: args[0..count) as long longs, each into the next of the long long pointers
 * that follow; 0 with the error set at the first that is not an int of that range. */
int long_long_args(PyObject *const *args, int count, ...);

/* javahash.c: h = 31*h + unit over the UTF-16 code units of text (mod 2^32), continuing from h. */
uint32_t hash_units(uint32_t h, PyObject *text);

/* zlib's CRC-32 of p[0:n] (UtilAll.crc32 keeps its low 31 bits). */
static inline uint32_t crc32_of(const unsigned char *p, Py_ssize_t n) { return (uint32_t)crc32_z(0, p, (size_t)n); }

/* properties.c: properties.decode_properties of n bytes at p; properties_init makes the
 * shared names, once (-1 with an error set). */
int properties_init(void);
PyObject *decode_properties(const unsigned char *p, Py_ssize_t n);

/* properties.decode_properties' next pair in [*p, end): segments split on 0x02, each cut
 * at its first 0x01, a segment with an empty name or value holding none. 1 with the
 * pair's name and value (and *p past its segment); 0 when no pair is left. */
static inline int next_property(const unsigned char **p, const unsigned char *end, const unsigned char **name,
                                Py_ssize_t *name_length, const unsigned char **value, Py_ssize_t *value_length) {
    while (*p < end) {
        const unsigned char *start = *p;
        const unsigned char *cut_at = memchr(start, 0x02, end - start);
        const unsigned char *segment_end = cut_at == NULL ? end : cut_at;
        const unsigned char *split = memchr(start, 0x01, segment_end - start);
        *p = cut_at == NULL ? end : cut_at + 1;
        if (split != NULL && split > start && split < segment_end - 1) {
            *name = start;
            *name_length = split - start;
            *value = split + 1;
            *value_length = segment_end - split - 1;
            return 1;
        }
    }
    return 0;
}

/* Which of the properties the columns single out a name is: 0 KEYS, 1 TAGS, 2 UNIQ_KEY,
 * -1 any other. */
static inline int named_property(const unsigned char *p, Py_ssize_t n) {
    if (n == 4 && memcmp(p, "KEYS", 4) == 0) return 0;
    if (n == 4 && memcmp(p, "TAGS", 4) == 0) return 1;
    if (n == 8 && memcmp(p, "UNIQ_KEY", 8) == 0) return 2;
    return -1;
}
/* A growable column of int64s. */
typedef struct {
    int64_t *items;
    Py_ssize_t count, capacity;
} Column;

int column_push(Column *column, int64_t value);
PyObject *column_bytes(const Column *column);

/* Borrowed buffers of the int64 columns of a call, released together. */
typedef struct {
    Py_buffer views[8];
    int count;
} Buffers;

void release_buffers(Buffers *buffers);
const void *take_buffer(Buffers *buffers, PyObject *object, Py_ssize_t item, Py_ssize_t *items);

/* ---- Entry points (module.c's method table) ------------------------------------------ */

#define FASTCALL(name) PyObject *name(PyObject *module, PyObject *const *args, Py_ssize_t nargs)

/* javahash.c */
PyObject *java_string_hash(PyObject *module, PyObject *text);
FASTCALL(index_key_hash);
/* index.c */
FASTCALL(matching_offsets);
FASTCALL(index_put_keys);
/* record.c */
FASTCALL(configure);
FASTCALL(decode_record);
FASTCALL(read_records);
FASTCALL(encode_records);
/* consumequeue.c */
FASTCALL(first_stored_after);
FASTCALL(store_times);
FASTCALL(queue_unit_blocks);
/* properties.c */
FASTCALL(encode_common_properties);
FASTCALL(property_pairs);
/* columnar.c */
FASTCALL(walk_starts);
FASTCALL(body_crcs);
/* dispatch.c */
FASTCALL(span_texts);
FASTCALL(span_key_hashes);
PyObject *tags_codes(PyObject *module, PyObject *tags);
FASTCALL(message_key_hashes);
/* validate.c */
FASTCALL(screen_batch);

#undef FASTCALL

#endif
