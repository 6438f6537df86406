// The official RocketMQ 5 Node.js client (npm rocketmq-client-nodejs), unmodified, as a
// user runs it: COUNT messages with a tag, two keys and a user property, 16 sends in
// flight. Each receipt is printed as one JSON line (what was sent and the receipt).
//
//   node official_producer.js ENDPOINT TOPIC COUNT
'use strict';
const { Producer } = require('rocketmq-client-nodejs');

const IN_FLIGHT = 16;

async function main() {
  const [endpoint, topic, countText] = process.argv.slice(2);
  const count = Number(countText);
  // The writer serves plaintext here; the client speaks TLS unless told not to.
  const producer = new Producer({ endpoints: endpoint, sslEnabled: false, requestTimeout: 10000 });
  await producer.startup();
  let next = 0;
  async function worker() {
    while (next < count) {
      const n = next++;
      const sent = {
        topic,
        body: `node message ${n}`,
        tag: `NodeTag${n % 3}`,
        keys: [`node-order-${n}`, `node-customer-${n % 50}`].sort(),
        properties: { seq: String(n) },
      };
      const receipt = await producer.send({
        topic,
        tag: sent.tag,
        keys: sent.keys,
        properties: new Map(Object.entries(sent.properties)),
        body: Buffer.from(sent.body),
      });
      const line = { ...sent, n, message_id: receipt.messageId, offset: Number(receipt.offset), queue_id: receipt.messageQueue.queueId };
      process.stdout.write(JSON.stringify(line) + '\n');
    }
  }
  await Promise.all(Array.from({ length: IN_FLIGHT }, worker));
  await producer.shutdown();
}

main().then(() => process.exit(0), (error) => {
  process.stderr.write(`${error && error.stack || error}\n`);
  process.exit(1);
});
