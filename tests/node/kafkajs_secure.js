// kafkajs over SSL or SASL_SSL against Mink: produce ten values, consume them back. Prints one
// JSON line: {"consumed": [values...]}. Usage: node kafkajs_secure.js SPEC (JSON: broker,
// topic, ca, optional sasl {mechanism, username, password}, optional cert and key files).
const fs = require("fs");
const { Kafka, logLevel } = require("kafkajs");

const spec = JSON.parse(process.argv[2]);
const ssl = { ca: [fs.readFileSync(spec.ca, "utf-8")] };
if (spec.cert) {
  ssl.cert = fs.readFileSync(spec.cert, "utf-8");
  ssl.key = fs.readFileSync(spec.key, "utf-8");
}
const kafka = new Kafka({ clientId: "mink-kafkajs-secure", brokers: [spec.broker], ssl,
                          sasl: spec.sasl, logLevel: logLevel.WARN, retry: { retries: 10 } });

async function main() {
  const admin = kafka.admin();
  await admin.connect();
  await admin.createTopics({ topics: [{ topic: spec.topic, numPartitions: 1 }],
                             waitForLeaders: true });
  await admin.disconnect();
  const producer = kafka.producer();
  await producer.connect();
  const messages = [];
  for (let i = 0; i < 10; i++) messages.push({ value: `kjs-${i}` });
  await producer.send({ topic: spec.topic, messages });
  await producer.disconnect();

  const consumer = kafka.consumer({ groupId: `kjs-${spec.topic}` });
  await consumer.connect();
  await consumer.subscribe({ topic: spec.topic, fromBeginning: true });
  const consumed = [];
  await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error("timed out consuming")), 60000);
    consumer.run({
      eachMessage: async ({ message }) => {
        consumed.push(message.value.toString());
        if (consumed.length >= 10) { clearTimeout(timer); resolve(); }
      },
    });
  });
  await consumer.disconnect();
  console.log(JSON.stringify({ consumed }));
}

main().catch((err) => { console.error(err); process.exit(1); });
