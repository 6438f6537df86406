/*
 * Compiled fast paths of the codecs (rmqstore.common.codec._speedups).
 *
 * Each function here is the hot loop of a Python function that stays the definition:
 *
 *   java_string_hash, index_key_hash   javahash.java_string_hash / index_key_hash
 *   matching_offsets                   files.index.IndexFile.matching_offsets
 *   decode_record                      record.decode_record
 *   read_records                       commitlog.CommitLog._read_through_file, for many offsets
 *   first_stored_after                 files.consumequeue.ConsumeQueue.offset_by_time's bisection
 *   store_times                        files.commitlog.CommitLog.store_times_of_units
 *   encode_records                     record.encode_record over a writer's batch
 *   encode_common_properties           properties.encode_messages_properties (KEYS, TAGS, UNIQ_KEY)
 *   walk_starts, body_crcs             columnar.walk's loop, the bodies' CRCs of columnar.decode
 *   property_pairs                     columnar's split of the properties into pairs
 *   span_texts, span_key_hashes        dispatch.DispatchBatch.of_columns: topics, tags, index key hashes
 *   tags_codes, message_key_hashes     dispatch.DispatchBatch.of_messages: tags codes, index key hashes
 *   index_put_keys                     files.index.IndexFile.put_keys
 *   screen_batch                       message_rules.plainly_valid
 *   queue_unit_blocks                  consumequeue.queue_unit_blocks
 *
 * The fast paths only ever succeed. Where the bytes are anything but a well-formed
 * record or chain (a BLANK filler, zeros, a bad size or CRC, a read past the buffer), they
 * return None and the caller runs the Python function, which decides what the bytes are
 * and raises its exact errors. So every error path and message is written once, in
 * Python, and tests compare both paths on the same bytes (tests/test_speedups.py).
 *
 * The functions live in the files beside this one, by concern; speedups.h declares them.
 */
#include "speedups.h"

static PyMethodDef methods[] = {
    {"java_string_hash", (PyCFunction)java_string_hash, METH_O, "String.hashCode of a str, as a signed int32."},
    {"index_key_hash", (PyCFunction)(void (*)(void))index_key_hash, METH_FASTCALL,
     "index_key_hash(topic, key): IndexFile.indexKeyHashMethod of topic#key."},
    {"matching_offsets", (PyCFunction)(void (*)(void))matching_offsets, METH_FASTCALL,
     "matching_offsets(buf, slots, entries, key_hash, number, steps, max_count) -> (offsets, number, steps) | None."},
    {"configure", (PyCFunction)(void (*)(void))configure, METH_FASTCALL,
     "configure(Record, address, slot names | None): what decode_record builds records with."},
    {"decode_record", (PyCFunction)(void (*)(void))decode_record, METH_FASTCALL,
     "decode_record(buf, pos, check_crc, end) -> Record | None."},
    {"read_records", (PyCFunction)(void (*)(void))read_records, METH_FASTCALL,
     "read_records(fd, positions, file_size, start_offset, read_ahead, check_crc, match) -> list[Record | None | False]."},
    {"first_stored_after", (PyCFunction)(void (*)(void))first_stored_after, METH_FASTCALL,
     "first_stored_after(units, lo, hi, timestamp, strict, fd, file_start, file_size) -> int | None."},
    {"store_times", (PyCFunction)(void (*)(void))store_times, METH_FASTCALL,
     "store_times(units, lo, hi, fd, file_start, file_size, out) -> int."},
    {"walk_starts", (PyCFunction)(void (*)(void))walk_starts, METH_FASTCALL,
     "walk_starts(buf, position, limit, rows_max) -> (starts, position)."},
    {"body_crcs", (PyCFunction)(void (*)(void))body_crcs, METH_FASTCALL,
     "body_crcs(data, at, length) -> bytes of native int64 CRCs."},
    {"span_texts", (PyCFunction)(void (*)(void))span_texts, METH_FASTCALL,
     "span_texts(data, at, length) -> list[str | None]."},
    {"span_key_hashes", (PyCFunction)(void (*)(void))span_key_hashes, METH_FASTCALL,
     "span_key_hashes(data, prefixes, uniq_at, uniq_length, keys_at, keys_length) -> (hashes, counts) | None."},
    {"property_pairs", (PyCFunction)(void (*)(void))property_pairs, METH_FASTCALL,
     "property_pairs(data, at, length) -> (pair_ends, name_at, name_length, value_at, value_length, keys, tags, "
     "uniq_key, repeated)."},
    {"tags_codes", (PyCFunction)tags_codes, METH_O, "tags_codes(tags) -> list[int]."},
    {"message_key_hashes", (PyCFunction)(void (*)(void))message_key_hashes, METH_FASTCALL,
     "message_key_hashes(prefixes, uniq_keys, keys) -> (hashes, counts)."},
    {"encode_common_properties", (PyCFunction)(void (*)(void))encode_common_properties, METH_FASTCALL,
     "encode_common_properties(order, keys, tags, uniq_keys[, pieces]) -> list[bytes]."},
    {"index_put_keys", (PyCFunction)(void (*)(void))index_put_keys, METH_FASTCALL,
     "index_put_keys(buf, slots, start, begin_ts, key_hashes, phy_offsets, timestamps) -> new_slots | None."},
    {"queue_unit_blocks", (PyCFunction)(void (*)(void))queue_unit_blocks, METH_FASTCALL,
     "queue_unit_blocks(topics, queue_ids, queue_offsets, commitlog_offsets, sizes, tags_codes)"
     " -> [(topic, queue_id, first_queue_offset, last_position, units)] | None."},
    {"screen_batch", (PyCFunction)(void (*)(void))screen_batch, METH_FASTCALL,
     "screen_batch(bodies, keys, tags, uniq_keys, queue_ids, max_body, max_keys, max_key_length, max_tags_length)"
     " -> bool."},
    {"encode_records", (PyCFunction)(void (*)(void))encode_records, METH_FASTCALL,
     "encode_records(first_offset, queue_ids, flags, queue_offsets, born_timestamps_ms, born_hosts, bodies, "
     "topics, properties, store_timestamp_ms, store_host, now_ms) -> (bytes, sizes)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_speedups", "Compiled fast paths of rmqstore's codecs.", -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__speedups(void) {
    if (properties_init() < 0) return NULL;
    return PyModule_Create(&module_def);
}
