// Runs against a live `lakehouse serve` that lakehouse_dagster_tests/test_service_node.py starts and seeds; it
// passes what to expect in LAKEHOUSE_TEST_EXPECT (JSON). Run by hand: LAKEHOUSE_URL=… LAKEHOUSE_API_TOKEN=…
// LAKEHOUSE_TEST_EXPECT='{…}' npm test
import assert from "node:assert/strict";
import { test } from "node:test";

import { LakehouseClient, LakehouseError } from "../src/index.js";

const url = process.env.LAKEHOUSE_URL;
const token = process.env.LAKEHOUSE_API_TOKEN;
const expect = JSON.parse(process.env.LAKEHOUSE_TEST_EXPECT ?? "{}");
const skip = url ? false : "LAKEHOUSE_URL is not set: no service to test against";
const client = new LakehouseClient({ url, token });

test("reads Arrow through the router, with its decision", { skip }, async () => {
  const got = await client.read({ reader: "export.stream", datasetId: expect.iceberg.id, order: "row_index" });
  assert.equal(got.source, "iceberg");
  assert.equal(got.reason, "iceberg@eventual");
  assert.equal(got.snapshotId, expect.iceberg.snapshot_id);
  assert.equal(got.table.numRows, expect.iceberg.rows);
  assert.deepEqual(got.table.schema.fields.map((f) => f.name), expect.iceberg.columns);
  const n = got.table.getChild("n").toArray();
  assert.equal(Number(n[0]), expect.iceberg.first_n);
  assert.equal(got.table.getChild("name").get(1), expect.iceberg.second_name);
});

test("streams record batches one at a time", { skip }, async () => {
  const open = await client.openRead({ reader: "export.stream", datasetId: expect.iceberg.id, columns: ["n"] });
  let batches = 0;
  let rows = 0;
  for await (const batch of open.batches) {
    batches += 1;
    rows += batch.numRows;
  }
  assert.equal(rows, expect.iceberg.rows);
  assert.ok(batches > 1, `expected several batches, got ${batches}`);
});

test("reads rows as NDJSON from Postgres with a limit", { skip }, async () => {
  const got = await client.readRows({
    reader: "export.stream",
    datasetId: expect.postgres.id,
    columns: ["n", "name"],
    limit: 3,
    order: "row_index",
  });
  assert.equal(got.source, "postgres");
  assert.equal(got.reason, "pg@off");
  assert.equal(got.snapshotId, null);
  assert.deepEqual(got.rows, expect.postgres.first_rows);
});

test("a structured read: the same answer from Iceberg and from Postgres, refusals as one line", { skip }, async () => {
  const query = {
    where: { op: "lt", column: "n", value: 10 },
    aggregate: { group_by: [], measures: [{ fn: "count" }, { fn: "sum", column: "n" }, { fn: "max", column: "name" }] },
  };
  const ice = await client.readRows({ reader: "export.stream", datasetId: expect.iceberg.id, ...query });
  assert.equal(ice.source, "iceberg");
  // an int64 sum is decimal(38, 0): a digit string in NDJSON, never rounded through a JS number
  assert.deepEqual(ice.rows, [{ count: 10, sum_n: "45", max_name: "iceberg 9 ✓" }]);
  const pg = await client.readRows({ reader: "dashboards.aggregate", datasetId: expect.iceberg.id, ...query });
  assert.equal(pg.source, "postgres");
  assert.deepEqual(pg.rows, ice.rows);
  // a keyset page as Arrow, in __row_index order
  const page = await client.read({ reader: "export.stream", datasetId: expect.iceberg.id, columns: ["n"], after_row_index: 99, limit: 5 });
  assert.deepEqual(Array.from(page.table.getChild("n").toArray(), Number), [100, 101, 102, 103, 104]);
  await assert.rejects(
    client.readRows({ reader: "export.stream", datasetId: expect.iceberg.id, where: { op: "eq", column: "nope", value: 1 } }),
    (err) => err instanceof LakehouseError && err.status === 400 && err.reason.startsWith("where: unknown column 'nope'"),
  );
});

test("route and flags", { skip }, async () => {
  const route = await client.route({ reader: "export.stream", datasetId: expect.iceberg.id });
  assert.equal(route.source, "iceberg");
  assert.equal(route.snapshot_id, expect.iceberg.snapshot_id);
  const flags = await client.flags({ datasetId: expect.iceberg.id });
  const reader = flags.readers.find((r) => r.name === "export.stream");
  assert.equal(reader.mode, "iceberg");
  assert.equal(reader.reason, "dataset override");
  assert.deepEqual(await client.ready(), { status: "ready", postgres: "ok", catalog: "ok" });
});

test("ingest runs the writer", { skip }, async () => {
  const result = await client.ingest({ datasetId: expect.ingest.id, writer: "sync.full" });
  assert.equal(result.path, "pg");
  assert.equal(result.rows, expect.ingest.rows);
});

test("reports a fallback its own router took, refusing bad reports", { skip }, async () => {
  const got = await client.fallback({
    reader: "graph.kuzu",
    datasetId: expect.iceberg.id,
    reason: "ml-runner: read timed out (reported by node)",
  });
  assert.equal(got.recorded, true);
  assert.equal(got.reader, "graph.kuzu");
  assert.equal(got.dataset_id, expect.iceberg.id);
  assert.equal(got.dataset_name, "iceberg");
  assert.equal(typeof got.fallback_id, "number");
  await assert.rejects(
    client.fallback({ reader: "graph.kuzuu", datasetId: expect.iceberg.id, reason: "x" }),
    (err) => err instanceof LakehouseError && err.status === 400 && err.reason.startsWith("unknown reader 'graph.kuzuu'"),
  );
  await assert.rejects(
    client.fallback({ reader: "graph.kuzu", datasetId: "not-a-uuid", reason: "x" }),
    (err) => err instanceof LakehouseError && err.status === 400 && err.reason.includes("is not a valid UUID"),
  );
  const metrics = await client.metrics();
  assert.match(metrics, /lakehouse_read_fallbacks_total\{reader="graph.kuzu"\} 1\.0/);
});

test("refusals carry the status and the one-line reason", { skip }, async () => {
  await assert.rejects(
    client.read({ reader: "export.streem", datasetId: expect.iceberg.id }),
    (err) => err instanceof LakehouseError && err.status === 400 && err.reason.startsWith("unknown reader 'export.streem'"),
  );
  await assert.rejects(
    client.ingest({ datasetId: expect.iceberg.id, writer: "row.edit" }),
    (err) => err instanceof LakehouseError && err.status === 400 && err.reason.includes("locked to pg"),
  );
  const stranger = new LakehouseClient({ url, token: "not-the-token-at-all" });
  await assert.rejects(stranger.route({ reader: "export.stream", datasetId: expect.iceberg.id }), (err) => {
    return err instanceof LakehouseError && err.status === 401 && err.reason === "unauthorized";
  });
});
