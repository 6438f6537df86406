// A Node.js client of rmqstore's own contracts, written as a new user would: @grpc/grpc-js
// and @grpc/proto-loader loading protos/ as they are. It sends one message with Send, two
// with SendBatch and two on a SendStream, then asks a query node every QueryService lookup
// about them, and prints what it got as one JSON document.
//
//   node own_contracts.js PROTOS_DIR WRITER_ENDPOINT QUERY_ENDPOINT TOPIC
'use strict';
const path = require('node:path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const DEADLINE_MS = 15000;

function load(protos) {
  const definition = protoLoader.loadSync(
    ['rmqstore/v1/writer.proto', 'rmqstore/v1/query.proto'].map((p) => path.join(protos, p)),
    { includeDirs: [protos], keepCase: true, longs: Number, enums: String, defaults: true, bytes: Buffer },
  );
  return grpc.loadPackageDefinition(definition).rmqstore.v1;
}

function unary(client, method, request) {
  return new Promise((resolve, reject) => {
    const deadline = new Date(Date.now() + DEADLINE_MS);
    client[method](request, { deadline }, (error, response) => (error ? reject(error) : resolve(response)));
  });
}

function streamed(client, method, request) {
  return new Promise((resolve, reject) => {
    const call = client[method](request, { deadline: new Date(Date.now() + DEADLINE_MS) });
    const items = [];
    call.on('data', (item) => items.push(item));
    call.on('error', reject);
    call.on('end', () => resolve(items));
  });
}

function sendStream(client, batches) {
  return new Promise((resolve, reject) => {
    const call = client.SendStream({ deadline: new Date(Date.now() + DEADLINE_MS) });
    const acks = [];
    call.on('data', (response) => {
      acks.push(...response.results);
      if (acks.length === batches.reduce((n, b) => n + b.messages.length, 0)) call.end();
    });
    call.on('error', reject);
    call.on('end', () => resolve(acks));
    for (const batch of batches) call.write(batch);
  });
}

function message(topic, n) {
  return { topic, body: Buffer.from(`own contract ${n}`), keys: [`own-${n}`, 'own-all'], tags: `T${n}`, properties: { n: String(n) } };
}

function view(stored) {
  return {
    topic: stored.topic, queue_id: stored.queue_id, queue_offset: stored.queue_offset, body: stored.body.toString(),
    keys: stored.keys, tags: stored.tags, uniq_key: stored.uniq_key, offset_msg_id: stored.offset_msg_id,
  };
}

async function main() {
  const [protos, writerEndpoint, queryEndpoint, topic] = process.argv.slice(2);
  const v1 = load(protos);
  const writer = new v1.WriterService(writerEndpoint, grpc.credentials.createInsecure());
  const query = new v1.QueryService(queryEndpoint, grpc.credentials.createInsecure());
  const acks = [];
  acks.push((await unary(writer, 'Send', { message: { ...message(topic, 0), queue_id: 0 } })).result);
  acks.push(...(await unary(writer, 'SendBatch', { messages: [1, 2].map((n) => ({ ...message(topic, n), queue_id: 0 })) })).results);
  acks.push(...(await sendStream(writer, [3, 4].map((n) => ({ messages: [{ ...message(topic, n), queue_id: 0 }] })))));
  const out = { acks: acks.map((a) => ({ uniq_key: a.uniq_key, queue_id: a.queue_id, queue_offset: a.queue_offset, offset_msg_id: a.offset_msg_id })) };
  // The query node follows the writer: wait (bounded) until the last message is visible.
  for (let attempt = 0; attempt < 100; attempt++) {
    const bounds = await unary(query, 'QueueBounds', { topic, queue_id: 0 });
    if (bounds.max_offset >= 5) break;
    await new Promise((r) => setTimeout(r, 100));
  }
  out.by_key = (await unary(query, 'QueryByKey', { topic, key: 'own-all', page_size: 100 })).messages.map(view);
  out.by_uniq_key = (await unary(query, 'QueryByUniqKey', { topic, uniq_key: acks[2].uniq_key })).messages.map(view);
  out.by_msg_id = view((await unary(query, 'QueryByMsgId', { msg_id: acks[3].offset_msg_id })).message);
  out.by_queue_offset = view((await unary(query, 'QueryByQueueOffset', { topic, queue_id: 0, queue_offset: 4 })).message);
  const pulled = await unary(query, 'Pull', { topic, queue_id: 0, from_offset: 1, max_count: 2 });
  out.pull = { messages: pulled.messages.map(view), next_offset: pulled.next_offset, min_offset: pulled.min_offset, max_offset: pulled.max_offset };
  out.queue_bounds = await unary(query, 'QueueBounds', { topic, queue_id: 0 });
  const first = out.by_queue_offset;
  const stored = (await unary(query, 'QueryByQueueOffset', { topic, queue_id: 0, queue_offset: 0 })).message;
  out.search_offset = await unary(query, 'SearchOffset', { topic, queue_id: 0, timestamp_ms: stored.store_timestamp_ms, boundary: 'BOUNDARY_LOWER' });
  out.stream_by_time = (await streamed(query, 'StreamByTime', { topic, queue_id: 0, begin_ms: 0, end_ms: Date.now() + 60000 })).map(view);
  out.list_topics = (await unary(query, 'ListTopics', {})).topics.filter((t) => t.name === topic);
  const stats = await unary(query, 'Stats', {});
  out.stats = { messages: stats.messages, follows_writer: stats.follows_writer };
  out.ping = await unary(query, 'Ping', {});
  out.first = first;
  process.stdout.write(JSON.stringify(out) + '\n');
  writer.close();
  query.close();
}

main().then(() => process.exit(0), (error) => {
  process.stderr.write(`${error && error.stack || error}\n`);
  process.exit(1);
});
