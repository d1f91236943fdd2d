import type { RecordBatch, RecordBatchReader, Schema, Table } from "apache-arrow";

import type { Query } from "./query.js";

export type {
  Aggregate,
  AllOf,
  Compare,
  InList,
  Measure,
  Negation,
  NullTest,
  OrderKey,
  Predicate,
  Query,
} from "./query.js";

export declare const ARROW_STREAM: "application/vnd.apache.arrow.stream";
export declare const NDJSON: "application/x-ndjson";

/** The readers of the runbooks (lakehouse flags list shows them with their ceilings). */
export type Reader =
  | "export.stream"
  | "graph.kuzu"
  | "studio.digest"
  | "studio.training_pairs"
  | "studio.preview"
  | "objects.sync"
  | "dashboards.aggregate"
  | "pipeline.expectations"
  | "sdk.files.list"
  | "mediaset.item";
/** The source writers the service runs (the Postgres-locked writers are refused). */
export type Writer = "sync.full" | "sync.append" | "sync.incremental" | "cdc.append";

/**
 * A read: the reader and dataset, and the request's fields (query.d.ts, generated from docs/reads.schema.json):
 * columns, limit and order "row_index" as before; where, aggregate, row_ids, after_row_index, row_index and order by
 * columns make it a structured read (docs/reads.md). Values in a where are typed by their column: a number, a
 * string, "NaN" / "Infinity" / "-Infinity" for a float, ISO text for a timestamp or a date.
 */
export interface ReadRequest extends Query {
  reader: Reader;
  datasetId: string;
}

/** The read router's decision, from the response headers. */
export interface Routing {
  source: "iceberg" | "postgres";
  /** iceberg@eventual, iceberg@strict, iceberg@native, pg@off, pg@shadow, pg@no-snapshot, pg@lagging, pg@fallback */
  reason: string;
  mode: "off" | "shadow" | "iceberg" | "iceberg_only";
  /** The Iceberg snapshot served (63-bit, as text); null when Postgres served. */
  snapshotId: string | null;
}

export interface OpenRead extends Routing {
  schema: Schema;
  batches: RecordBatchReader & AsyncIterable<RecordBatch>;
}

export interface RouteDecision {
  reader: string;
  dataset_id: string;
  mode: string;
  mode_reason: string;
  source: "pg" | "iceberg" | "refused";
  reason: string;
  /** 63-bit: as text. */
  snapshot_id: string | null;
  consistency: "EVENTUAL" | "STRICT";
  native: boolean;
  rows_version: number | null;
  snapshot_covers_version: number | null;
  /** Present when source is "refused": the one-line reason. */
  refusal?: string;
}

export interface FlagState {
  name: string;
  mode: string;
  reason: string;
  stored_mode: string;
  ceiling: string;
  consistency?: "EVENTUAL" | "STRICT";
  describe: string;
}

export interface Flags {
  dataset_id: string;
  dataset_name: string;
  readers: FlagState[];
  writers: FlagState[];
}

export interface IngestResult {
  dataset_id: string;
  writer: Writer;
  path: "pg" | "native";
  rows: number;
  total_rows: number | null;
  /** 63-bit: as text. */
  snapshot_id: string | null;
  sync_id: string | null;
  cursor: unknown;
  flag_reason: string;
  seconds: number;
  new: boolean;
  compacted_rows: number;
}

/** What POST /lakehouse/fallback recorded. */
export interface FallbackRecorded {
  recorded: true;
  fallback_id: number;
  /** ISO time the service recorded it. */
  at: string;
  reader: Reader;
  dataset_id: string;
  dataset_name: string;
  /** The reader's effective mode for the dataset now. */
  mode: string;
}

export declare class LakehouseError extends Error {
  readonly status: number;
  /** The service's one-line reason: what was wrong and what to do. */
  readonly reason: string;
  /** Seconds to wait before retrying (503s). */
  readonly retryAfter: number | null;
}

export interface ClientOptions {
  /** The service, e.g. http://127.0.0.1:3001 (the runbooks' ML_RUNNER_URL). */
  url: string;
  /** LAKEHOUSE_API_TOKEN (the runbooks' ML_RUNNER_TOKEN). */
  token?: string;
  /** How many times a 503 is retried after its Retry-After (default 5). */
  retries?: number;
  fetch?: typeof fetch;
}

export declare class LakehouseClient {
  constructor(options: ClientOptions);
  openRead(request: ReadRequest, options?: { signal?: AbortSignal }): Promise<OpenRead>;
  read(request: ReadRequest, options?: { signal?: AbortSignal }): Promise<Routing & { table: Table }>;
  readRows(
    request: ReadRequest,
    options?: { signal?: AbortSignal },
  ): Promise<Routing & { rows: Record<string, unknown>[] }>;
  ingest(request: { datasetId: string; writer: Writer }, options?: { signal?: AbortSignal }): Promise<IngestResult>;
  route(request: { reader: Reader; datasetId: string }): Promise<RouteDecision>;
  flags(request: { datasetId: string }): Promise<Flags>;
  /** Report a fallback to Postgres that the app's own router took (the Iceberg error as the reason). */
  fallback(request: { reader: Reader; datasetId: string; reason: string }): Promise<FallbackRecorded>;
  ready(): Promise<{ status: "ready"; postgres: "ok"; catalog: "ok" }>;
  metrics(): Promise<string>;
}
