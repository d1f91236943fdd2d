// Generated from docs/reads.schema.json by lakehouse_dagster/service/ts_types.py — do not edit by hand:
//   python -m lakehouse_dagster.service.ts_types > clients/typescript/src/query.d.ts
// (test_ts_types.py fails when this file and the schema drift apart). The shapes: docs/reads.md.

export interface Aggregate {
  /** at most 16 item(s) */
  group_by?: string[];
  /** at least 1 item(s); at most 64 item(s) */
  measures: Measure[];
}

export interface AllOf {
  /** at least 1 item(s); at most 200 item(s) */
  args: (Compare | InList | NullTest | AllOf | Negation)[];
  op: "and" | "or";
}

export interface Compare {
  column: string;
  op: "eq" | "ne" | "lt" | "le" | "gt" | "ge";
  value: unknown;
}

export interface InList {
  column: string;
  op: "in";
  /** at least 1 item(s); at most 1000 item(s) */
  values: unknown[];
}

export interface Measure {
  column?: string;
  fn: "count" | "count_distinct" | "sum" | "avg" | "min" | "max";
  name?: string;
}

export interface Negation {
  arg: Compare | InList | NullTest | AllOf | Negation;
  op: "not";
}

export interface NullTest {
  column: string;
  op: "is_null" | "not_null";
}

export interface OrderKey {
  column: string;
  desc?: boolean;
}

export interface Query {
  /** ≥ -1; ≤ 9223372036854775807 */
  after_row_index?: number;
  aggregate?: Aggregate;
  columns?: string[];
  /** ≥ 0; ≤ 1000000000 */
  limit?: number;
  order?: "row_index" | OrderKey[];
  /** at least 1 item(s); at most 10000 item(s) */
  row_ids?: string[];
  /** at least 1 item(s); at most 1000 item(s) */
  row_index?: [number, number][];
  where?: Compare | InList | NullTest | AllOf | Negation;
}

/** One node of a where tree. */
export type Predicate = Compare | InList | NullTest | AllOf | Negation;
