// The official RocketMQ 5 Node.js client's transactional producer (npm
// rocketmq-client-nodejs), unmodified, as a user runs it. Each line on stdout is one JSON
// object, printed at once.
//
//   node official_transactions.js end ENDPOINT TOPIC COUNT
//   node official_transactions.js orphan ENDPOINT TOPIC COUNT CHECKS SECONDS
//
// end: COUNT half messages ("commit N" for even N, "rollback N" for odd), each ended at once
// by its transaction's commit or rollback. orphan: COUNT such half messages never ended; the
// producer then stays up until its checker was asked CHECKS times (or SECONDS passed). The
// checker answers COMMIT for a body starting "commit", ROLLBACK otherwise, and prints
// {"checked": body, "answer": ...}.
'use strict';
const { Producer } = require('rocketmq-client-nodejs');
const { TransactionResolution } = require('rocketmq-client-nodejs/proto/apache/rocketmq/v2/definition_pb');

async function main() {
  const [mode, endpoint, topic, countText, checksText, secondsText] = process.argv.slice(2);
  const count = Number(countText);
  let checked = 0;
  const checker = {
    async check(messageView) {
      const body = messageView.body.toString();
      const commit = body.startsWith('commit');
      process.stdout.write(JSON.stringify({ checked: body, message_id: messageView.messageId, answer: commit ? 'COMMIT' : 'ROLLBACK' }) + '\n');
      checked += 1;
      return commit ? TransactionResolution.COMMIT : TransactionResolution.ROLLBACK;
    },
  };
  // The writer serves plaintext here; the client speaks TLS unless told not to.
  const producer = new Producer({ endpoints: endpoint, sslEnabled: false, requestTimeout: 10000, topic, checker });
  await producer.startup();
  for (let n = 0; n < count; n++) {
    const body = `${n % 2 === 0 ? 'commit' : 'rollback'} ${n}`;
    const transaction = producer.beginTransaction();
    const receipt = await producer.send({ topic, tag: 'Tx', keys: [body.replace(' ', '-')], body: Buffer.from(body) }, transaction);
    const line = { sent: body, message_id: receipt.messageId, transaction_id: receipt.transactionId };
    if (mode === 'end') {
      if (n % 2 === 0) {
        await transaction.commit();
        line.resolution = 'COMMIT';
      } else {
        await transaction.rollback();
        line.resolution = 'ROLLBACK';
      }
    }
    process.stdout.write(JSON.stringify(line) + '\n');
  }
  if (mode === 'orphan') {
    const deadline = Date.now() + Number(secondsText) * 1000;
    while (checked < Number(checksText) && Date.now() < deadline) {
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
    await new Promise((resolve) => setTimeout(resolve, 1000)); // the last answer's EndTransaction
  }
  await producer.shutdown();
}

main().catch((error) => {
  process.stderr.write(`${error.stack || error}\n`);
  process.exit(1);
});
