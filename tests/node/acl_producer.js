// The official RocketMQ 5 Node.js client (npm rocketmq-client-nodejs), unmodified, with
// session credentials: one producer signed with ACCESS_KEY and ACCESS_SECRET sends one
// message to TOPIC and prints one JSON line, the receipt or the error it was handed.
//
//   node acl_producer.js ENDPOINT ACCESS_KEY ACCESS_SECRET TOPIC
'use strict';
const { Producer } = require('rocketmq-client-nodejs');

async function main() {
  const [endpoint, accessKey, accessSecret, topic] = process.argv.slice(2);
  const producer = new Producer({
    endpoints: endpoint, sslEnabled: false, requestTimeout: 5000, sessionCredentials: { accessKey, accessSecret },
  });
  let line;
  try {
    await producer.startup();
    const receipt = await producer.send({ topic, keys: [`acl-${topic}`], body: Buffer.from(`signed message to ${topic}`) });
    line = { topic, message_id: receipt.messageId, offset: Number(receipt.offset) };
  } catch (error) {
    line = { topic, error: error.name, code: error.code === undefined ? null : error.code, message: error.message };
  }
  process.stdout.write(JSON.stringify(line) + '\n');
  await producer.shutdown().catch(() => {});
}

main().then(() => process.exit(0), (error) => { console.error(error); process.exit(1); });
