// The official RocketMQ 5 Node.js client (npm rocketmq-client-nodejs), unmodified: for each
// TOPIC:TYPE argument (TYPE NORMAL, FIFO, DELAY, due a second ahead, or TRANSACTION,
// committed at once) one message, and
// one JSON line with its receipt, or the error the client raised (its class and words)
// when it refused the send.
//
//   node typed_producer.js ENDPOINT TOPIC:TYPE...
'use strict';
const { Producer } = require('rocketmq-client-nodejs');
// The client takes its checker's answer as the protocol's enum, which it does not re-export.
const { TransactionResolution } = require('rocketmq-client-nodejs/proto/apache/rocketmq/v2/definition_pb');

function messageOf(topic, kind) {
  const message = { topic, body: Buffer.from(`${kind} to ${topic}`), keys: [`${kind}-${topic}`] };
  if (kind === 'FIFO') message.messageGroup = 'group-1';
  if (kind === 'DELAY') message.deliveryTimestamp = new Date(Date.now() + 1000);
  return message;
}

async function main() {
  const [endpoint, ...pairs] = process.argv.slice(2);
  const wanted = pairs.map((pair) => pair.split(':'));
  // The writer serves plaintext here; the client speaks TLS unless told not to. No topics
  // up front: with them the client may miss the settings the writer answers at once and
  // wait for the next ones (its startup waits for a settings command after the routes).
  // Every transaction here is committed at once: a check would mean a lost commit.
  const checker = { check: async () => TransactionResolution.ROLLBACK };
  const producer = new Producer({ endpoints: endpoint, sslEnabled: false, requestTimeout: 10000, checker });
  await producer.startup();
  for (const [topic, kind] of wanted) {
    const line = { topic, type: kind };
    try {
      let receipt;
      if (kind === 'TRANSACTION') {
        const transaction = producer.beginTransaction();
        receipt = await producer.send(messageOf(topic, kind), transaction);
        await transaction.commit();
      } else {
        receipt = await producer.send(messageOf(topic, kind));
      }
      Object.assign(line, { message_id: receipt.messageId, offset: Number(receipt.offset) });
    } catch (error) {
      Object.assign(line, { error: error.constructor.name, message: error.message });
    }
    process.stdout.write(JSON.stringify(line) + '\n');
  }
  await producer.shutdown();
}

main().then(() => process.exit(0), (error) => {
  process.stderr.write(`${error && error.stack || error}\n`);
  process.exit(1);
});
