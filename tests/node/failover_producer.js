// The official RocketMQ 5 Node.js client (npm rocketmq-client-nodejs), unmodified, as an
// application runs it against a writer group whose primary fails over: a send that fails is
// reported and a new one tried, until STOP_FILE exists. One JSON line per receipt
// ({n, message_id, offset, queue_id}) or per failure ({n, error}), with its wall time (t, s).
//
//   node failover_producer.js ENDPOINT TOPIC STOP_FILE
'use strict';
const fs = require('node:fs');
const { Producer } = require('rocketmq-client-nodejs');

const RETRY_PAUSE_MS = 100;

function emit(line) {
  process.stdout.write(JSON.stringify({ ...line, t: Date.now() / 1000 }) + '\n');
}

async function main() {
  const [endpoint, topic, stopFile] = process.argv.slice(2);
  // The writer serves plaintext here; the client speaks TLS unless told not to.
  const producer = new Producer({ endpoints: endpoint, sslEnabled: false, requestTimeout: 5000 });
  await producer.startup();
  for (let n = 0; !fs.existsSync(stopFile); n++) {
    try {
      const receipt = await producer.send({ topic, keys: [`node-${n}`], body: Buffer.from(`node ${n} to ${topic}`) });
      emit({ n, message_id: receipt.messageId, offset: Number(receipt.offset), queue_id: receipt.messageQueue.queueId });
    } catch (error) {
      emit({ n, error: String(error && error.message || error).slice(0, 300) });
      await new Promise((resolve) => setTimeout(resolve, RETRY_PAUSE_MS));
    }
  }
  try {
    await producer.shutdown();
  } catch (error) {
    // rocketmq-client-nodejs 1.x can log after closing its log file at shutdown ("log stream
    // had been closed"): the sends are what this driver reports, and they are all printed.
    process.stderr.write(`shutdown: ${error && error.message || error}\n`);
  }
}

main().then(() => process.exit(0), (error) => {
  process.stderr.write(`${error && error.stack || error}\n`);
  process.exit(1);
});
