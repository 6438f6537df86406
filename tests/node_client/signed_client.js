// A Node.js client of rmqstore.v1 that signs its calls with a few lines of its own, the way
// RocketMQ 5 clients sign theirs (docs/security.md): HMAC-SHA1 of x-mq-date-time under the
// secret key, in hex. Usage: node signed_client.js PROTOS_DIR WRITER_ENDPOINT QUERY_ENDPOINT
// ACCESS_KEY SECRET_KEY TOPIC. Prints one JSON line: the send's result and the pulled message.
"use strict";
const crypto = require("crypto");
const path = require("path");
const grpc = require("@grpc/grpc-js");
const protoLoader = require("@grpc/proto-loader");

const [protos, writerEndpoint, queryEndpoint, accessKey, secretKey, topic] = process.argv.slice(2);

function signed() {
  const dateTime = new Date().toISOString().replace(/[-:]/g, "").replace(/\.\d+Z$/, "Z");
  const signature = crypto.createHmac("sha1", secretKey).update(dateTime).digest("hex");
  const metadata = new grpc.Metadata();
  metadata.set("x-mq-date-time", dateTime);
  metadata.set("authorization", `MQv2-HMAC-SHA1 Credential=${accessKey}, SignedHeaders=x-mq-date-time, Signature=${signature}`);
  return metadata;
}

const options = { keepCase: true, longs: Number, defaults: true, includeDirs: [protos] };
const definition = protoLoader.loadSync(
  ["rmqstore/v1/writer.proto", "rmqstore/v1/query.proto"].map((p) => path.join(protos, p)),
  options,
);
const v1 = grpc.loadPackageDefinition(definition).rmqstore.v1;
const writer = new v1.WriterService(writerEndpoint, grpc.credentials.createInsecure());
const query = new v1.QueryService(queryEndpoint, grpc.credentials.createInsecure());
const deadline = () => Date.now() + 10000;

function fail(what, error) {
  console.log(JSON.stringify({ failed: what, code: error.code, details: error.details }));
  process.exit(1);
}

writer.Send({ message: { topic, queue_id: 0, body: Buffer.from("from node") } }, signed(), { deadline: deadline() }, (error, sent) => {
  if (error) fail("Send", error);
  const pull = { topic, queue_id: 0, from_offset: sent.result.queue_offset, max_count: 1 };
  let attempts = 0;
  const tryPull = () => {
    query.Pull(pull, signed(), { deadline: deadline() }, (pullError, pulled) => {
      if (pullError) fail("Pull", pullError);
      if (pulled.messages.length === 0 && ++attempts < 100) return setTimeout(tryPull, 50);
      const message = pulled.messages[0];
      console.log(JSON.stringify({ queue_offset: sent.result.queue_offset, body: message ? message.body.toString() : null }));
      writer.close();
      query.close();
    });
  };
  tryPull();
});
