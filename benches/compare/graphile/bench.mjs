// Drains N no-op jobs with Graphile Worker (batched localQueue mode unless LOCAL=0,
// concurrency C, default 24: its fastest documented settings) and prints its jobs/s.
// Run by benches/compare/graphile.sh, which installs it and names the database (GW_URL).
import { run, makeWorkerUtils } from "graphile-worker";

const N = parseInt(process.env.N || "100000");
const connectionString = process.env.GW_URL;
const local = process.env.LOCAL !== "0";
const utils = await makeWorkerUtils({ connectionString });
await utils.migrate();
await utils.withPgClient((c) => c.query("delete from graphile_worker._private_jobs"));
const specs = [];
for (let i = 0; i < N; i++) specs.push({ identifier: "noop", payload: { i } });
for (let i = 0; i < N; i += 10000) await utils.addJobs(specs.slice(i, i + 10000));
await utils.withPgClient((c) => c.query("vacuum analyze graphile_worker._private_jobs"));
await utils.release();

let done = 0;
let t0 = null;
let resolveDone;
const finished = new Promise((r) => (resolveDone = r));
const preset = local
  ? { worker: { localQueue: { size: 500 }, completeJobBatchDelay: 0, failJobBatchDelay: 0 } }
  : undefined;
const runner = await run({
  connectionString,
  concurrency: parseInt(process.env.C || "24"),
  noHandleSignals: true,
  pollInterval: 1000,
  preset,
  taskList: {
    noop: async () => {
      if (t0 === null) t0 = process.hrtime.bigint();
      if (++done === N) resolveDone();
    },
  },
});
await finished;
const secs = Number(process.hrtime.bigint() - t0) / 1e9;
console.log(
  `graphile-worker ${local ? "localQueue" : "default"}: ${N} jobs in ${secs.toFixed(2)}s = ${(N / secs).toFixed(0)} jobs/s`,
);
await runner.stop();
process.exit(0);
