// The official RocketMQ 5 Node.js client (npm rocketmq-client-nodejs), unmodified, with
// session credentials: one SimpleConsumer of GROUP on TOPIC, signed with ACCESS_KEY and
// ACCESS_SECRET, starts and prints one JSON line: that it started, or the error its
// startup() was rejected with (a startup still pending after 20 s prints "hung").
//
//   node acl_consumer.js ENDPOINT ACCESS_KEY ACCESS_SECRET TOPIC GROUP
'use strict';
const { SimpleConsumer } = require('rocketmq-client-nodejs');

const STARTUP_MS = 20000;

async function main() {
  const [endpoint, accessKey, accessSecret, topic, group] = process.argv.slice(2);
  const consumer = new SimpleConsumer({
    endpoints: endpoint, sslEnabled: false, requestTimeout: 5000, sessionCredentials: { accessKey, accessSecret },
    consumerGroup: group, subscriptions: new Map([[topic, '*']]),
  });
  let timer;
  const hung = new Promise((resolve) => { timer = setTimeout(() => resolve({ topic, group, error: 'hung' }), STARTUP_MS); });
  const started = consumer.startup().then(
    () => ({ topic, group, started: true }),
    (error) => ({ topic, group, error: error.name, code: error.code === undefined ? null : error.code, message: error.message }),
  );
  const line = await Promise.race([started, hung]);
  clearTimeout(timer);
  process.stdout.write(JSON.stringify(line) + '\n');
  await consumer.shutdown().catch(() => {});
}

main().then(() => process.exit(0), (error) => { console.error(error); process.exit(1); });
