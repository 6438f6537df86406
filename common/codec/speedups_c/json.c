/* send --file's JSON Lines and ack lines. */
#include "speedups.h"

/* The columns of `rmqstore send --file`'s parsed JSON lines (a list of dicts): topics,
 * queue ids, bodies (the text's UTF-8), keys, tags and uniq keys — or None as soon as a
 * line is anything but plain (an unknown or other field, a value of another type, a queue
 * id outside [0, 2^31 − 1]), which the caller then checks line by line to word the error. */

static int field_is(PyObject *name, const char *text, Py_ssize_t length) {
    return PyUnicode_IS_COMPACT_ASCII(name) && PyUnicode_GET_LENGTH(name) == length &&
           memcmp(PyUnicode_1BYTE_DATA(name), text, (size_t)length) == 0;
}

PyObject *json_columns(PyObject *module, PyObject *documents) {
    if (!PyList_Check(documents)) {
        PyErr_SetString(PyExc_TypeError, "json_columns takes a list");
        return NULL;
    }
    Py_ssize_t count = PyList_GET_SIZE(documents);
    PyObject *columns[6] = {NULL};
    PyObject *empty_text = PyUnicode_FromStringAndSize("", 0), *empty_body = PyBytes_FromStringAndSize("", 0);
    PyObject *result = NULL;
    if (empty_text == NULL || empty_body == NULL) goto done;
    for (int c = 0; c < 6; c++) {
        columns[c] = PyList_New(count);
        if (columns[c] == NULL) goto done;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *document = PyList_GET_ITEM(documents, i);
        if (!PyDict_CheckExact(document)) goto plain_no;
        PyObject *topic = NULL, *queue_id = Py_None, *body = empty_body, *keys = NULL, *tags = empty_text,
                 *uniq_key = empty_text;
        PyObject *name, *value;
        Py_ssize_t position = 0;
        int owned_body = 0;
        while (PyDict_Next(document, &position, &name, &value)) {
            if (!PyUnicode_Check(name)) goto no_line;
            if (field_is(name, "topic", 5)) {
                if (!PyUnicode_CheckExact(value)) goto no_line;
                topic = value;
            } else if (field_is(name, "body", 4)) {
                if (!PyUnicode_CheckExact(value)) goto no_line;
                Py_ssize_t length;
                const char *text = PyUnicode_AsUTF8AndSize(value, &length);
                if (text == NULL) goto failed_line;
                if (owned_body) Py_DECREF(body);
                body = PyBytes_FromStringAndSize(text, length);
                if (body == NULL) goto failed_line;
                owned_body = 1;
            } else if (field_is(name, "keys", 4)) {
                if (!PyList_CheckExact(value)) goto no_line;
                for (Py_ssize_t k = 0; k < PyList_GET_SIZE(value); k++)
                    if (!PyUnicode_CheckExact(PyList_GET_ITEM(value, k))) goto no_line;
                keys = value;
            } else if (field_is(name, "tags", 4)) {
                if (!PyUnicode_CheckExact(value)) goto no_line;
                tags = value;
            } else if (field_is(name, "uniqKey", 7)) {
                if (!PyUnicode_CheckExact(value)) goto no_line;
                uniq_key = value;
            } else if (field_is(name, "queueId", 7)) {
                if (value == Py_None) continue;
                if (!PyLong_CheckExact(value)) goto no_line;
                int overflow;
                long long id = PyLong_AsLongLongAndOverflow(value, &overflow);
                if (overflow || id < 0 || id > INT32_MAX) goto no_line;
                queue_id = value;
            } else {
                goto no_line;
            }
        }
        if (topic == NULL) goto no_line;
        PyObject *row[6] = {topic, queue_id, body, keys, tags, uniq_key};
        for (int c = 0; c < 6; c++) {
            if (c == 3 && keys == NULL) {
                row[3] = PyList_New(0);
                if (row[3] == NULL) goto failed_line;
            } else if (!(c == 2 && owned_body)) {
                Py_INCREF(row[c]);
            }
            PyList_SET_ITEM(columns[c], i, row[c]);
            if (c == 2) owned_body = 0; /* the column holds it now */
        }
        continue;
    no_line:
        if (owned_body) Py_DECREF(body);
        goto plain_no;
    failed_line:
        if (owned_body) Py_DECREF(body);
        goto done;
    }
    result = PyTuple_New(6);
    if (result == NULL) goto done;
    for (int c = 0; c < 6; c++) {
        PyTuple_SET_ITEM(result, c, columns[c]);
        columns[c] = NULL;
    }
    goto done;
plain_no:
    result = Py_None;
    Py_INCREF(result);
done:
    for (int c = 0; c < 6; c++) Py_XDECREF(columns[c]);
    Py_XDECREF(empty_text);
    Py_XDECREF(empty_body);
    return result;
}

/* `rmqstore send --file`'s whole fast path in one pass: the JSON Lines file's bytes straight
 * to serialized SendBatchRequests, with no Python object per message (only the topic text
 * each ack line needs, shared by the messages of one topic). The parse is JSON's grammar
 * restricted to what json_columns accepts: one object a line, its fields among topic, body,
 * keys, tags, uniqKey and queueId, each of the type it takes there, none twice; the values
 * are screened by screen_batch's rules. Anything else — another field, a value of another
 * type, an escape that is not JSON's, bytes that are not UTF-8, an object spanning lines, a
 * message the screen would refuse — answers None, and the caller takes the parse-and-check
 * path, which accepts the same files and words every error. So this parser never decides
 * that a line is bad; it only vouches for lines that are plainly good, and the tests hold
 * its requests to that path's byte for byte. */

typedef struct {
    const char *data; /* into the file, or NULL: at `offset` in the line's scratch buffer */
    Py_ssize_t offset, length;
} Text;

typedef struct {
    char *bytes;
    Py_ssize_t length, capacity;
} Buffer;

static int buffer_reserve(Buffer *buffer, Py_ssize_t more) {
    if (buffer->length + more <= buffer->capacity) return 0;
    Py_ssize_t capacity = buffer->capacity ? buffer->capacity : 4096;
    while (capacity < buffer->length + more) capacity *= 2;
    char *grown = PyMem_Realloc(buffer->bytes, (size_t)capacity);
    if (grown == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    buffer->bytes = grown;
    buffer->capacity = capacity;
    return 0;
}

static inline const char *text_at(const Text *text, const Buffer *scratch) {
    return text->data != NULL ? text->data : scratch->bytes + text->offset;
}

static inline const char *skip_blanks(const char *p, const char *end) {
    while (p < end && (*p == ' ' || *p == '\t' || *p == '\r')) p++;
    return p;
}

static int hex_digit(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static int hex4(const char *p, const char *end) {
    if (end - p < 4) return -1;
    int value = 0;
    for (int i = 0; i < 4; i++) {
        int digit = hex_digit(p[i]);
        if (digit < 0) return -1;
        value = value << 4 | digit;
    }
    return value;
}

/* The length of the well-formed UTF-8 sequence at p (RFC 3629: no overlong forms, no
 * surrogates, nothing above U+10FFFF), or 0. */
static Py_ssize_t utf8_sequence(const unsigned char *p, const unsigned char *end) {
    unsigned char c = p[0];
    if (c >= 0xC2 && c <= 0xDF) return end - p >= 2 && (p[1] & 0xC0) == 0x80 ? 2 : 0;
    if (c >= 0xE0 && c <= 0xEF) {
        if (end - p < 3 || (p[1] & 0xC0) != 0x80 || (p[2] & 0xC0) != 0x80) return 0;
        if (c == 0xE0 && p[1] < 0xA0) return 0; /* overlong */
        if (c == 0xED && p[1] >= 0xA0) return 0; /* a surrogate */
        return 3;
    }
    if (c >= 0xF0 && c <= 0xF4) {
        if (end - p < 4 || (p[1] & 0xC0) != 0x80 || (p[2] & 0xC0) != 0x80 || (p[3] & 0xC0) != 0x80) return 0;
        if (c == 0xF0 && p[1] < 0x90) return 0; /* overlong */
        if (c == 0xF4 && p[1] >= 0x90) return 0; /* above U+10FFFF */
        return 4;
    }
    return 0;
}

static char *put_utf8(char *p, int code_point) {
    if (code_point < 0x80) {
        *p++ = (char)code_point;
    } else if (code_point < 0x800) {
        *p++ = (char)(0xC0 | code_point >> 6);
        *p++ = (char)(0x80 | (code_point & 0x3F));
    } else if (code_point < 0x10000) {
        *p++ = (char)(0xE0 | code_point >> 12);
        *p++ = (char)(0x80 | (code_point >> 6 & 0x3F));
        *p++ = (char)(0x80 | (code_point & 0x3F));
    } else {
        *p++ = (char)(0xF0 | code_point >> 18);
        *p++ = (char)(0x80 | (code_point >> 12 & 0x3F));
        *p++ = (char)(0x80 | (code_point >> 6 & 0x3F));
        *p++ = (char)(0x80 | (code_point & 0x3F));
    }
    return p;
}

/* The JSON string at *at (its opening quote), as UTF-8: a span of the file when it has no
 * escape, else decoded into `scratch`. *at moves past the closing quote. 1, 0 when the
 * string is not plainly valid JSON text, -1 with an error set. */
/* Whether any byte of the 8 in `word` is a quote, a backslash, a control character or
 * not ASCII: what ends a string's plain run (bit tricks over a whole word: a byte is zero
 * in x exactly when the high bit of (x − 0x01…) & ~x is set for it; below 0x20 likewise). */
static inline int plain_run_ends(uint64_t word) {
    const uint64_t ones = 0x0101010101010101ull, highs = 0x8080808080808080ull;
    uint64_t quote = word ^ (ones * '"'), backslash = word ^ (ones * '\\');
    return (((quote - ones) & ~quote) | ((backslash - ones) & ~backslash) | ((word - ones * 0x20) & ~word) | word) &
           highs ? 1 : 0;
}

static int json_string(const char **at, const char *end, Text *out, Buffer *scratch) {
    const char *p = *at + 1, *start = p;
    for (;;) {
        /* Eight bytes at a time while none of them needs a look (a body is mostly such runs). */
        while (end - p >= 8) {
            uint64_t word;
            memcpy(&word, p, 8);
            if (plain_run_ends(word)) break;
            p += 8;
        }
        if (p >= end) return 0;
        unsigned char c = (unsigned char)*p;
        if (c == '"') {
            out->data = start;
            out->offset = 0;
            out->length = p - start;
            *at = p + 1;
            return 1;
        }
        if (c == '\\') break;
        if (c < 0x20) return 0;
        if (c < 0x80) {
            p++;
            continue;
        }
        Py_ssize_t n = utf8_sequence((const unsigned char *)p, (const unsigned char *)end);
        if (n == 0) return 0;
        p += n;
    }
    /* An escape: the text so far, then the rest decoded, into the scratch buffer (at most
     * as long as the source: no escape decodes to more bytes than it is written with). */
    if (buffer_reserve(scratch, end - start) < 0) return -1;
    Py_ssize_t offset = scratch->length;
    char *w = scratch->bytes + offset;
    memcpy(w, start, (size_t)(p - start));
    w += p - start;
    for (;;) {
        if (p >= end) return 0;
        unsigned char c = (unsigned char)*p;
        if (c == '"') break;
        if (c < 0x20) return 0;
        if (c >= 0x80) {
            Py_ssize_t n = utf8_sequence((const unsigned char *)p, (const unsigned char *)end);
            if (n == 0) return 0;
            memcpy(w, p, (size_t)n);
            w += n;
            p += n;
            continue;
        }
        if (c != '\\') {
            *w++ = (char)c;
            p++;
            continue;
        }
        if (end - p < 2) return 0;
        char escaped = p[1];
        p += 2;
        switch (escaped) {
        case '"': *w++ = '"'; break;
        case '\\': *w++ = '\\'; break;
        case '/': *w++ = '/'; break;
        case 'b': *w++ = '\b'; break;
        case 'f': *w++ = '\f'; break;
        case 'n': *w++ = '\n'; break;
        case 'r': *w++ = '\r'; break;
        case 't': *w++ = '\t'; break;
        case 'u': {
            int code_point = hex4(p, end);
            if (code_point < 0) return 0;
            p += 4;
            if (code_point >= 0xDC00 && code_point <= 0xDFFF) return 0; /* a lone low surrogate */
            if (code_point >= 0xD800 && code_point <= 0xDBFF) {
                /* a pair's high half: its low half must follow */
                if (end - p < 6 || p[0] != '\\' || p[1] != 'u') return 0;
                int low = hex4(p + 2, end);
                if (low < 0xDC00 || low > 0xDFFF) return 0;
                p += 6;
                code_point = 0x10000 + ((code_point - 0xD800) << 10) + (low - 0xDC00);
            }
            w = put_utf8(w, code_point); /* at most as many bytes as the escape's 6 (or 12) */
            break;
        }
        default:
            return 0;
        }
    }
    out->data = NULL;
    out->offset = offset;
    out->length = (w - scratch->bytes) - offset;
    scratch->length = offset + out->length;
    *at = p + 1;
    return 1;
}

typedef struct {
    Text topic, body, tags, uniq_key;
    Text *keys; /* room for max_keys */
    Py_ssize_t key_count;
    long queue_id; /* -1: none given */
} JsonMessage;

enum { SEEN_TOPIC = 1, SEEN_BODY = 2, SEEN_KEYS = 4, SEEN_TAGS = 8, SEEN_UNIQ_KEY = 16, SEEN_QUEUE_ID = 32 };

typedef struct {
    Py_ssize_t max_body, max_keys, max_key_length, max_tags_length, max_uniq_key_length;
} Screen;

static inline int text_is(const Text *name, const Buffer *scratch, const char *literal, Py_ssize_t length) {
    return name->length == length && memcmp(text_at(name, scratch), literal, (size_t)length) == 0;
}

/* queueId's value at *at: a JSON integer in [0, 2^31 − 1] (1), or null (1, queue_id -1);
 * 0 for anything else, as json_columns declines other numbers (floats, exponents, negatives). */
static int json_queue_id(const char **at, const char *end, long *queue_id) {
    const char *p = *at;
    if (end - p >= 4 && memcmp(p, "null", 4) == 0) {
        *queue_id = -1;
        *at = p + 4;
        return 1;
    }
    if (p >= end || *p < '0' || *p > '9') return 0;
    if (*p == '0' && p + 1 < end && p[1] >= '0' && p[1] <= '9') return 0; /* a leading zero */
    long value = 0;
    while (p < end && *p >= '0' && *p <= '9') {
        value = value * 10 + (*p - '0');
        if (value > INT32_MAX) return 0;
        p++;
    }
    if (p < end && (*p == '.' || *p == 'e' || *p == 'E')) return 0;
    *queue_id = value;
    *at = p;
    return 1;
}

/* What follows a value of an array or object at *p: 1 after a comma (another value comes,
 * *p at it), 0 after `closer` (*p past it), -1 for anything else. */
static int json_after_value(const char **p, const char *end, char closer) {
    const char *q = skip_blanks(*p, end);
    if (q < end && (*q == ',' || *q == closer)) {
        *p = *q == ',' ? skip_blanks(q + 1, end) : q + 1;
        return *q == ',';
    }
    return -1;
}

/* One line (without its newline) into *message: 1, 0 when it is not a plainly good
 * message, -1 with an error set. */
static int json_message(const char *p, const char *end, JsonMessage *message, Buffer *scratch, const Screen *screen) {
    static const char empty[] = "";
    Text none = {empty, 0, 0};
    message->topic = message->body = message->tags = message->uniq_key = none;
    message->key_count = 0;
    message->queue_id = -1;
    scratch->length = 0;
    int seen = 0, found;
    p = skip_blanks(p, end);
    if (p >= end || *p != '{') return 0;
    p = skip_blanks(p + 1, end);
    if (p < end && *p == '}') return 0; /* no topic */
    for (;;) {
        Text name;
        if (p >= end || *p != '"') return 0;
        if ((found = json_string(&p, end, &name, scratch)) != 1) return found;
        p = skip_blanks(p, end);
        if (p >= end || *p != ':') return 0;
        p = skip_blanks(p + 1, end);
        int field;
        Text *text = NULL;
        if (text_is(&name, scratch, "topic", 5)) field = SEEN_TOPIC, text = &message->topic;
        else if (text_is(&name, scratch, "body", 4)) field = SEEN_BODY, text = &message->body;
        else if (text_is(&name, scratch, "tags", 4)) field = SEEN_TAGS, text = &message->tags;
        else if (text_is(&name, scratch, "uniqKey", 7)) field = SEEN_UNIQ_KEY, text = &message->uniq_key;
        else if (text_is(&name, scratch, "keys", 4)) field = SEEN_KEYS;
        else if (text_is(&name, scratch, "queueId", 7)) field = SEEN_QUEUE_ID;
        else return 0;
        if (seen & field) return 0; /* twice: JSON keeps the last, the slow path shows which */
        seen |= field;
        if (text != NULL) {
            if (p >= end || *p != '"') return 0;
            if ((found = json_string(&p, end, text, scratch)) != 1) return found;
        } else if (field == SEEN_QUEUE_ID) {
            if (!json_queue_id(&p, end, &message->queue_id)) return 0;
        } else {
            if (p >= end || *p != '[') return 0;
            p = skip_blanks(p + 1, end);
            if (p < end && *p == ']') {
                p++;
            } else {
                for (;;) {
                    if (message->key_count == screen->max_keys) return 0;
                    if (p >= end || *p != '"') return 0;
                    if ((found = json_string(&p, end, &message->keys[message->key_count++], scratch)) != 1) return found;
                    if ((found = json_after_value(&p, end, ']')) != 1) break;
                }
                if (found < 0) return 0;
            }
        }
        if ((found = json_after_value(&p, end, '}')) != 1) break;
    }
    if (found < 0) return 0;
    if (skip_blanks(p, end) != end || !(seen & SEEN_TOPIC)) return 0;
    /* screen_batch's rules, on the UTF-8: a text is ASCII when all its bytes are. */
    if (message->body.length > screen->max_body) return 0;
    for (Py_ssize_t k = 0; k < message->key_count; k++) {
        const Text *key = &message->keys[k];
        if (key->length == 0 || key->length > screen->max_key_length) return 0;
        const unsigned char *t = (const unsigned char *)text_at(key, scratch);
        for (Py_ssize_t j = 0; j < key->length; j++)
            if (t[j] >= 0x80 || t[j] == 0x01 || t[j] == 0x02 || t[j] == ' ') return 0;
    }
    if (message->tags.length > screen->max_tags_length) return 0;
    const unsigned char *t = (const unsigned char *)text_at(&message->tags, scratch);
    for (Py_ssize_t j = 0; j < message->tags.length; j++)
        if (t[j] >= 0x80 || t[j] == 0x01 || t[j] == 0x02) return 0;
    if (message->uniq_key.length > screen->max_uniq_key_length) return 0;
    t = (const unsigned char *)text_at(&message->uniq_key, scratch);
    for (Py_ssize_t j = 0; j < message->uniq_key.length; j++) {
        unsigned char u = t[j];
        if (!((u >= '0' && u <= '9') || (u >= 'A' && u <= 'Z') || (u >= 'a' && u <= 'z'))) return 0;
    }
    return 1;
}

/* A length-delimited field of a Text into the buffer (room reserved by the caller). */
static inline char *put_text(char *p, unsigned char tag, const Text *text, const Buffer *scratch) {
    *p++ = (char)tag;
    p = (char *)put_varint((unsigned char *)p, (uint64_t)text->length);
    memcpy(p, text_at(text, scratch), (size_t)text->length);
    return p + text->length;
}

static inline Py_ssize_t text_field_size(const Text *text) {
    return 1 + varint_size((uint64_t)text->length) + text->length;
}

/* The message's fields as message_fields writes them: topic, queue id, body, keys, tags,
 * uniq key; empty ones left out (such a line has no properties). */
static int put_json_message(Buffer *out, const JsonMessage *m, const Buffer *scratch) {
    Py_ssize_t size = text_field_size(&m->topic);
    uint64_t queue_id = (uint64_t)m->queue_id;
    if (m->queue_id >= 0) size += 1 + varint_size(queue_id);
    if (m->body.length) size += text_field_size(&m->body);
    for (Py_ssize_t k = 0; k < m->key_count; k++) size += text_field_size(&m->keys[k]);
    if (m->tags.length) size += text_field_size(&m->tags);
    if (m->uniq_key.length) size += text_field_size(&m->uniq_key);
    if (buffer_reserve(out, 1 + varint_size((uint64_t)size) + size) < 0) return -1;
    char *p = out->bytes + out->length;
    *p++ = 0x0A; /* SendBatchRequest.messages */
    p = (char *)put_varint((unsigned char *)p, (uint64_t)size);
    p = put_text(p, 0x0A, &m->topic, scratch);
    if (m->queue_id >= 0) {
        *p++ = 0x10;
        p = (char *)put_varint((unsigned char *)p, queue_id);
    }
    if (m->body.length) p = put_text(p, 0x1A, &m->body, scratch);
    for (Py_ssize_t k = 0; k < m->key_count; k++) p = put_text(p, 0x22, &m->keys[k], scratch);
    if (m->tags.length) p = put_text(p, 0x2A, &m->tags, scratch);
    if (m->uniq_key.length) p = put_text(p, 0x3A, &m->uniq_key, scratch);
    out->length = p - out->bytes;
    return 0;
}

/* The topic's text: one str per distinct topic, found by its UTF-8 in `topics` (which
 * holds it); the previous line's topic is compared first, as a file's lines often share one. */
static PyObject *topic_text(PyObject *topics, const Text *topic, const Buffer *scratch, PyObject **last_key,
                            PyObject **last_text) {
    const char *data = text_at(topic, scratch);
    if (*last_key != NULL && PyBytes_GET_SIZE(*last_key) == topic->length &&
        memcmp(PyBytes_AS_STRING(*last_key), data, (size_t)topic->length) == 0)
        return *last_text;
    PyObject *key = PyBytes_FromStringAndSize(data, topic->length);
    if (key == NULL) return NULL;
    PyObject *text = PyDict_GetItemWithError(topics, key);
    if (text == NULL) {
        if (PyErr_Occurred() || (text = PyUnicode_DecodeUTF8(data, topic->length, NULL)) == NULL) {
            Py_DECREF(key);
            return NULL;
        }
        int stored = PyDict_SetItem(topics, key, text);
        Py_DECREF(text); /* the dict holds it */
        if (stored < 0) {
            Py_DECREF(key);
            return NULL;
        }
    }
    Py_XSETREF(*last_key, key);
    *last_text = text;
    return text;
}

/* The request in `batch` ended (compact_results = true, then `tail`) and appended to
 * `requests` as bytes; `batch` emptied for the next. -1 on an error. */
static int end_request(Buffer *batch, const char *tail, Py_ssize_t tail_size, PyObject *requests) {
    if (buffer_reserve(batch, 2 + tail_size) < 0) return -1;
    batch->bytes[batch->length++] = 0x10; /* compact_results = true */
    batch->bytes[batch->length++] = 0x01;
    memcpy(batch->bytes + batch->length, tail, (size_t)tail_size);
    batch->length += tail_size;
    PyObject *request = PyBytes_FromStringAndSize(batch->bytes, batch->length);
    int appended = request == NULL ? -1 : PyList_Append(requests, request);
    Py_XDECREF(request);
    batch->length = 0;
    return appended;
}

PyObject *jsonl_send_batches(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError, "jsonl_send_batches takes (data, batch_size, max_body, max_keys, "
                                         "max_key_length, max_tags_length, max_uniq_key_length, request_tail)");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) return NULL;
    Screen screen;
    Py_ssize_t batch_size = PyLong_AsSsize_t(args[1]);
    screen.max_body = PyLong_AsSsize_t(args[2]);
    screen.max_keys = PyLong_AsSsize_t(args[3]);
    screen.max_key_length = PyLong_AsSsize_t(args[4]);
    screen.max_tags_length = PyLong_AsSsize_t(args[5]);
    screen.max_uniq_key_length = PyLong_AsSsize_t(args[6]);
    PyObject *result = NULL, *requests = NULL, *message_topics = NULL, *topics = NULL, *last_key = NULL, *last_text = NULL;
    Buffer batch = {NULL, 0, 0}, scratch = {NULL, 0, 0};
    JsonMessage message;
    message.keys = NULL;
    if (PyErr_Occurred()) goto done;
    if (batch_size < 1 || screen.max_keys < 0) {
        PyErr_SetString(PyExc_ValueError, "batch_size must be at least 1 and max_keys at least 0");
        goto done;
    }
    if (!PyBytes_Check(args[7])) {
        PyErr_SetString(PyExc_TypeError, "request_tail must be bytes");
        goto done;
    }
    /* Fields written after compact_results in every request (the request's shared
     * properties, serialized). */
    const char *tail = PyBytes_AS_STRING(args[7]);
    Py_ssize_t tail_size = PyBytes_GET_SIZE(args[7]);
    message.keys = PyMem_Malloc(sizeof(Text) * (size_t)(screen.max_keys + 1));
    requests = PyList_New(0);
    message_topics = PyList_New(0);
    topics = PyDict_New();
    if (message.keys == NULL || requests == NULL || message_topics == NULL || topics == NULL) {
        if (!PyErr_Occurred()) PyErr_NoMemory();
        goto done;
    }
    const char *p = view.buf, *end = p + view.len;
    Py_ssize_t in_batch = 0;
    while (p < end) {
        const char *line_end = memchr(p, '\n', (size_t)(end - p));
        if (line_end == NULL) line_end = end;
        if (skip_blanks(p, line_end) != line_end) {
            int found = json_message(p, line_end, &message, &scratch, &screen);
            if (found < 0) goto failed;
            if (found == 0) goto not_plain;
            PyObject *topic = topic_text(topics, &message.topic, &scratch, &last_key, &last_text);
            if (topic == NULL || PyList_Append(message_topics, topic) < 0) goto failed;
            if (put_json_message(&batch, &message, &scratch) < 0) goto failed;
            if (++in_batch == batch_size) {
                if (end_request(&batch, tail, tail_size, requests) < 0) goto failed;
                in_batch = 0;
            }
        }
        if (line_end == end) break;
        p = line_end + 1;
    }
    if (in_batch && end_request(&batch, tail, tail_size, requests) < 0) goto failed;
    if (PyList_GET_SIZE(message_topics) == 0) goto not_plain; /* no message: the slow path words it */
    PyObject *distinct = PyDict_Values(topics);
    if (distinct == NULL) goto failed;
    result = PyTuple_Pack(3, requests, message_topics, distinct);
    Py_DECREF(distinct);
    goto done;
not_plain:
    result = Py_None;
    Py_INCREF(result);
    goto done;
failed:
    result = NULL;
done:
    PyBuffer_Release(&view);
    PyMem_Free(message.keys);
    PyMem_Free(batch.bytes);
    PyMem_Free(scratch.bytes);
    Py_XDECREF(requests);
    Py_XDECREF(message_topics);
    Py_XDECREF(topics);
    Py_XDECREF(last_key);
    return result;
}

/* send --file's ack lines, the text json.dumps would write for each acknowledged message,
 * built into one string instead of a str.format per line. Texts that json.dumps would
 * escape (quotes, backslashes, control or non-ASCII characters) or negative offsets answer
 * None: the caller then formats them in Python, so the output stays the same either way. */
static int plain_json_text(PyObject *text, const char **utf8, Py_ssize_t *size) {
    if (!PyUnicode_Check(text) || !PyUnicode_IS_ASCII(text)) return 0;
    *utf8 = (const char *)PyUnicode_1BYTE_DATA(text);
    *size = PyUnicode_GET_LENGTH(text);
    for (Py_ssize_t i = 0; i < *size; i++) {
        unsigned char c = (unsigned char)(*utf8)[i];
        if (c < 0x20 || c == '"' || c == '\\') return 0;
    }
    return 1;
}

PyObject *ack_lines(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "ack_lines takes (prefix, topics, uniq_keys, queue_ids, queue_offsets, "
                                         "commitlog_offsets, store_timestamp_ms)");
        return NULL;
    }
    const char *prefix;
    Py_ssize_t prefix_size;
    if (!plain_json_text(args[0], &prefix, &prefix_size)) Py_RETURN_NONE;
    long long stored = PyLong_AsLongLong(args[6]);
    if (stored == -1 && PyErr_Occurred()) return NULL;
    PyObject *columns[5] = {NULL};
    const char *names[5] = {"topics", "uniq_keys", "queue_ids", "queue_offsets", "commitlog_offsets"};
    PyObject *result = NULL;
    char *buffer = NULL;
    for (int k = 0; k < 5; k++) {
        columns[k] = PySequence_Fast(args[k + 1], names[k]);
        if (columns[k] == NULL) goto done;
    }
    /* The lines are as many as the shortest column, as zip() pairs them. */
    Py_ssize_t count = PySequence_Fast_GET_SIZE(columns[0]);
    for (int k = 1; k < 5; k++)
        if (PySequence_Fast_GET_SIZE(columns[k]) < count) count = PySequence_Fast_GET_SIZE(columns[k]);
    size_t capacity = 4096, used = 0;
    buffer = PyMem_Malloc(capacity);
    if (buffer == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        const char *topic, *uniq_key;
        Py_ssize_t topic_size, uniq_key_size;
        if (!plain_json_text(PySequence_Fast_GET_ITEM(columns[0], i), &topic, &topic_size) ||
            !plain_json_text(PySequence_Fast_GET_ITEM(columns[1], i), &uniq_key, &uniq_key_size)) {
            result = Py_NewRef(Py_None);
            goto done;
        }
        long long numbers[3];
        for (int k = 0; k < 3; k++) {
            numbers[k] = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(columns[k + 2], i));
            if (numbers[k] == -1 && PyErr_Occurred()) goto done;
        }
        if (numbers[2] < 0) {
            result = Py_NewRef(Py_None);
            goto done;
        }
        /* The fixed text is under 160 bytes, each of the 4 numbers under 21, the hex 16. */
        size_t needed = used + (size_t)(prefix_size + topic_size + uniq_key_size) + 320;
        if (needed > capacity) {
            while (capacity < needed) capacity *= 2;
            char *grown = PyMem_Realloc(buffer, capacity);
            if (grown == NULL) {
                PyErr_NoMemory();
                goto done;
            }
            buffer = grown;
        }
        char *out = buffer + used;
        out += sprintf(out, "{\"offsetMsgId\": \"");
        memcpy(out, prefix, (size_t)prefix_size);
        out += prefix_size;
        out += sprintf(out, "%016llX\", \"uniqKey\": \"", (unsigned long long)numbers[2]);
        memcpy(out, uniq_key, (size_t)uniq_key_size);
        out += uniq_key_size;
        out += sprintf(out, "\", \"topic\": \"");
        memcpy(out, topic, (size_t)topic_size);
        out += topic_size;
        out += sprintf(out, "\", \"queueId\": %lld, \"queueOffset\": %lld, \"commitLogOffset\": %lld, \"storeTimestamp\": %lld}\n",
                       numbers[0], numbers[1], numbers[2], stored);
        used = (size_t)(out - buffer);
    }
    result = PyUnicode_DecodeASCII(buffer, (Py_ssize_t)used, NULL);
done:
    PyMem_Free(buffer);
    for (int k = 0; k < 5; k++) Py_XDECREF(columns[k]);
    return result;
}
