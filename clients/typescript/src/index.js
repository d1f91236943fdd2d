// Client of the lakehouse service (`lakehouse serve`, docs/service.md) for the live app: plain ESM with types in
// index.d.ts, so it drops in beside lib/lakehouse/read-router.ts and write-router.ts without a build step.
//
//   const lh = new LakehouseClient({ url: process.env.ML_RUNNER_URL, token: process.env.ML_RUNNER_TOKEN });
//   const { table, source, reason, snapshotId } = await lh.read({ reader: "export.stream", datasetId });
//   for await (const batch of (await lh.openRead({ reader, datasetId })).batches) { ... }   // one batch at a time
//   await lh.ingest({ datasetId, writer: "sync.full" });   // 503 (G2 backpressure) retried after Retry-After
//   const decision = await lh.route({ reader, datasetId }); // for an app that keeps its own router
//   await lh.fallback({ reader, datasetId, reason: String(err) }); // ...and tells the project when it fell back
//   const { rows } = await lh.readRows({ reader: "dashboards.aggregate", datasetId,                 // a structured
//     aggregate: { group_by: ["region"], measures: [{ fn: "count" }, { fn: "sum", column: "amount" }] } }); // read
import { RecordBatchReader, Table } from "apache-arrow";

export const ARROW_STREAM = "application/vnd.apache.arrow.stream";
export const NDJSON = "application/x-ndjson";

/** A non-2xx answer: the HTTP status, the service's one-line reason and, for a 503, the seconds to wait. */
export class LakehouseError extends Error {
  constructor(status, message, retryAfter = null) {
    super(`${status}: ${message}`);
    this.name = "LakehouseError";
    this.status = status;
    this.reason = message;
    this.retryAfter = retryAfter;
  }
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

function retryAfterSeconds(response) {
  const raw = Number(response.headers.get("retry-after"));
  return Number.isFinite(raw) && raw >= 0 ? Math.min(raw, 60) : 1;
}

async function failure(response) {
  const text = await response.text();
  let message = text.trim() || response.statusText;
  try {
    message = JSON.parse(text).error ?? message;
  } catch {
    // not JSON: the text itself
  }
  const retry = response.headers.has("retry-after") ? retryAfterSeconds(response) : null;
  return new LakehouseError(response.status, message, retry);
}

function routing(response) {
  const snapshot = response.headers.get("x-lakehouse-snapshot-id");
  return {
    source: response.headers.get("x-lakehouse-source"),
    reason: response.headers.get("x-lakehouse-reason"),
    mode: response.headers.get("x-lakehouse-mode"),
    // snapshot ids are 63-bit: kept as text, never rounded through a JS number
    snapshotId: snapshot === null ? null : snapshot,
  };
}

// Every field of the request (query.d.ts, generated from docs/reads.schema.json) is sent as it is: the service
// checks each against the dataset's schema and refuses an unknown one with its one-line reason.
function readBody({ reader, datasetId, ...query }) {
  const body = { reader, dataset_id: String(datasetId) };
  for (const [field, value] of Object.entries(query)) {
    if (value !== undefined && value !== null) body[field] = value;
  }
  return body;
}

export class LakehouseClient {
  /**
   * @param {{url: string, token?: string, retries?: number, fetch?: typeof fetch}} options
   */
  constructor({ url, token, retries = 5, fetch: fetchImpl = globalThis.fetch }) {
    if (!url) throw new Error("LakehouseClient needs the service's url (ML_RUNNER_URL)");
    this.url = url.replace(/\/+$/, "");
    this.token = token;
    this.retries = retries;
    this.fetch = fetchImpl;
  }

  async #send(method, path, { body, accept = "application/json", retry = true, signal } = {}) {
    const headers = { Accept: accept };
    if (this.token) headers.Authorization = `Bearer ${this.token}`;
    if (body !== undefined) headers["Content-Type"] = "application/json";
    for (let attempt = 0; ; attempt++) {
      const response = await this.fetch(this.url + path, {
        method,
        headers,
        body: body === undefined ? undefined : JSON.stringify(body),
        signal,
      });
      if (response.ok) return response;
      if (response.status === 503 && retry && attempt < this.retries) {
        await response.body?.cancel();
        await sleep(retryAfterSeconds(response) * 1000);
        continue;
      }
      throw await failure(response);
    }
  }

  /** The read as Arrow record batches as they arrive (memory bounded by a batch), with the router's decision. */
  async openRead(request, { signal } = {}) {
    const response = await this.#send("POST", "/lakehouse/read", { body: readBody(request), accept: ARROW_STREAM, signal });
    const reader = await RecordBatchReader.from(response.body);
    await reader.open();
    return { ...routing(response), schema: reader.schema, batches: reader };
  }

  /** The whole read as one Arrow table. */
  async read(request, options) {
    const { batches, schema, ...decision } = await this.openRead(request, options);
    const all = [];
    for await (const batch of batches) all.push(batch);
    return { ...decision, table: all.length ? new Table(all) : new Table(schema) };
  }

  /** The read as plain rows (NDJSON): timestamps and dates as ISO text, NaN/±Infinity as strings. */
  async readRows(request, { signal } = {}) {
    const response = await this.#send("POST", "/lakehouse/read", { body: readBody(request), accept: NDJSON, signal });
    const text = await response.text();
    const rows = text.split("\n").filter((line) => line.length > 0).map((line) => JSON.parse(line));
    return { ...routing(response), rows };
  }

  /** Run a source writer through the write router; a 503 (G2 backpressure) is retried after Retry-After. */
  async ingest({ datasetId, writer }, { signal } = {}) {
    const response = await this.#send("POST", "/lakehouse/ingest", {
      body: { dataset_id: String(datasetId), writer },
      signal,
    });
    return response.json();
  }

  /** The router's decision (source, mode, reason, snapshot id) for an app that keeps its own router. */
  async route({ reader, datasetId }) {
    const q = new URLSearchParams({ reader, dataset_id: String(datasetId) });
    return (await this.#send("GET", `/lakehouse/route?${q}`)).json();
  }

  /**
   * Report a fallback to Postgres that the app's own router (lib/lakehouse/read-router.ts) took: recorded as the
   * service's own fallbacks are (the soak restarts, the metric, the partition page, the overview).
   */
  async fallback({ reader, datasetId, reason }) {
    const response = await this.#send("POST", "/lakehouse/fallback", {
      body: { reader, dataset_id: String(datasetId), reason: String(reason) },
    });
    return response.json();
  }

  /** Every reader's and writer's effective mode for a dataset, and why. */
  async flags({ datasetId }) {
    const q = new URLSearchParams({ dataset_id: String(datasetId) });
    return (await this.#send("GET", `/lakehouse/flags?${q}`)).json();
  }

  async ready() {
    return (await this.#send("GET", "/readyz", { retry: false })).json();
  }

  async metrics() {
    return (await this.#send("GET", "/metrics", { accept: "text/plain" })).text();
  }
}
