// kafkajs' transactions against Mink: one transaction committed, one aborted, one committed,
// then a read_committed consumer (kafkajs' default isolation) reads the topic. Prints one JSON
// line: {"consumed": [values...]}. Usage: node kafkajs_transactions.js BROKER TOPIC
const { Kafka, logLevel } = require("kafkajs");

const [broker, topic] = process.argv.slice(2);
const kafka = new Kafka({ clientId: "mink-kafkajs", brokers: [broker], logLevel: logLevel.WARN,
                          retry: { retries: 10 } });

async function transaction(producer, prefix, count, commit) {
  const txn = await producer.transaction();
  for (let i = 0; i < count; i++) {
    await txn.send({ topic, messages: [{ value: `${prefix}-${i}`, partition: i % 3 }] });
  }
  if (commit) await txn.commit(); else await txn.abort();
}

async function main() {
  const admin = kafka.admin();
  await admin.connect();
  await admin.createTopics({ topics: [{ topic, numPartitions: 3 }], waitForLeaders: true });
  await admin.disconnect();

  const producer = kafka.producer({ transactionalId: `kafkajs-${topic}`, idempotent: true,
                                    maxInFlightRequests: 1 });
  await producer.connect();
  await transaction(producer, "committed", 6, true);
  await transaction(producer, "aborted", 6, false);
  await transaction(producer, "second", 3, true);
  await producer.disconnect();

  const consumer = kafka.consumer({ groupId: `kafkajs-check-${topic}`, readUncommitted: false });
  const consumed = [];
  await consumer.connect();
  await consumer.subscribe({ topic, fromBeginning: true });
  let lastAt = Date.now();
  await consumer.run({ eachMessage: async ({ message }) => {
    consumed.push(message.value.toString()); lastAt = Date.now();
  } });
  const deadline = Date.now() + 60000;
  // Until the nine committed values arrived and nothing more for 2 s (or the deadline).
  while (Date.now() < deadline && !(consumed.length >= 9 && Date.now() - lastAt > 2000)) {
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
  await consumer.disconnect();
  console.log(JSON.stringify({ consumed }));
}

main().catch((error) => { console.error(error); process.exit(1); });
