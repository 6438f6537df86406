// The official RocketMQ 5 Node.js client (npm rocketmq-client-nodejs), unmodified, as a
// user runs it: a SimpleConsumer of GROUP on TOPIC (tag filter `*`) receives batches of 32
// and acknowledges each message, until COUNT distinct messages came or DEADLINE_MS passed.
// Each received message is printed as one JSON line. Then, once an invisible duration has
// passed, it receives again: what an acknowledged message would come back as, printed with
// "after": true (a server that loses acknowledgements shows up there).
//
//   node official_simple_consumer.js ENDPOINT TOPIC GROUP COUNT
'use strict';
const { SimpleConsumer } = require('rocketmq-client-nodejs');

const BATCH = 32;
const INVISIBLE_MS = 2000;
const AWAIT_MS = 2000;
const DEADLINE_MS = 120000;

function line(message, after) {
  return JSON.stringify({
    message_id: message.messageId,
    topic: message.topic,
    body: message.body.toString(),
    tag: message.tag === undefined ? null : message.tag,
    keys: message.keys,
    delivery_attempt: message.deliveryAttempt,
    offset: message.offset === undefined ? null : Number(message.offset),
    corrupted: message.corrupted === true,  // the client leaves it unset on a good digest
    after,
  }) + '\n';
}

async function main() {
  const [endpoint, topic, group, countText] = process.argv.slice(2);
  const count = Number(countText);
  // The writer serves plaintext here; the client speaks TLS unless told not to.
  const consumer = new SimpleConsumer({
    endpoints: endpoint,
    sslEnabled: false,
    requestTimeout: 10000,
    consumerGroup: group,
    subscriptions: new Map([[topic, '*']]),
    awaitDuration: AWAIT_MS,
  });
  await consumer.startup();
  const seen = new Set();
  const started = Date.now();
  while (seen.size < count && Date.now() - started < DEADLINE_MS) {
    const messages = await consumer.receive(BATCH, INVISIBLE_MS);
    for (const message of messages) {
      process.stdout.write(line(message, false));
      seen.add(message.messageId);
      await consumer.ack(message);
    }
  }
  await new Promise((resolve) => setTimeout(resolve, INVISIBLE_MS + 500));
  for (const message of await consumer.receive(BATCH, INVISIBLE_MS)) {
    process.stdout.write(line(message, true));
  }
  await consumer.shutdown();
}

main().then(() => process.exit(0), (error) => {
  process.stderr.write(`${error && error.stack || error}\n`);
  process.exit(1);
});
