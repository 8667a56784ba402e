// A real BullMQ worker for the relay tests:
//   node bullmq_worker.mjs REDIS_URL QUEUE PREFIX EFFECTS_FILE [STARTS_FILE]
// Job names: "record" appends "<job id> <data as JSON>" to EFFECTS_FILE (after sleeping
// data.sleep seconds, if given); "fail" throws. With STARTS_FILE, every job appends
// "start <job id>" there when it starts and "end <job id>" when it ends (overlap tests).
// Prints "ready" once connected; SIGTERM closes.
import { appendFileSync } from "node:fs";
import { Worker } from "bullmq";

const [url, queue, prefix, effects, starts] = process.argv.slice(2);
const parsed = new URL(url);
const connection = {
  host: parsed.hostname,
  port: Number(parsed.port || 6379),
  db: Number(parsed.pathname.slice(1) || 0),
  maxRetriesPerRequest: null,
};

const worker = new Worker(
  queue,
  async (job) => {
    if (starts) appendFileSync(starts, `start ${job.id}\n`);
    try {
      return await run(job);
    } finally {
      if (starts) appendFileSync(starts, `end ${job.id}\n`);
    }
  },
  { connection, prefix, concurrency: 3 },
);

async function run(job) {
  if (job.name === "fail") throw new Error(`failed on purpose: ${JSON.stringify(job.data)}`);
  if (job.data.sleep) await new Promise((done) => setTimeout(done, job.data.sleep * 1000));
  appendFileSync(effects, `${job.id} ${JSON.stringify(job.data)}\n`);
  return "ok";
}
worker.on("error", (err) => console.error(`worker error: ${err.message}`));
await worker.waitUntilReady();
console.log("ready");

const stop = async () => {
  await worker.close();
  process.exit(0);
};
process.on("SIGTERM", stop);
process.on("SIGINT", stop);
