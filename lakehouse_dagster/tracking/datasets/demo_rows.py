"""The demo's rows, generated inside Postgres (issue 45: ``dataset_rows``'s owner holds the statements): one
``INSERT ... SELECT`` per dataset, every value computed from the row number, so a re-seed on another machine gives
the same data (row_id aside, which the table generates). demo/workspace.py creates the datasets and times these."""

from __future__ import annotations

import uuid

import psycopg

# The big dataset, generated inside Postgres: one INSERT ... SELECT over generate_series.
# Parameters: %(ds)s dataset id, %(n)s row count. Every value is computed from n, so a re-seed on another
# machine gives the same data (row_id aside, which the table generates).
_EVENTS_SQL = """
insert into dataset_rows (dataset_id, row_index, created_at, data)
select %(ds)s, g.n,
       timestamptz '2024-01-01 00:00:00+00' + g.n * interval '1 second',
       case when g.n %% 53 = 0 then o.obj - 'user_name' - 'amount' - 'payload'   -- nulls as missing keys
            else o.obj end
  from generate_series(0::bigint, %(n)s::bigint - 1) as g(n)
  cross join lateral (
    select timestamptz '2023-06-01 00:00:00+00' + g.n * interval '37.000123 seconds'
           - interval '20 days' * (g.n %% 1000 = 7)::int * 1000 as ts,          -- some before 1970
           (array[0, 330, -480, 60, 765, -210])[1 + (g.n %% 6)::int] as off_min
  ) t
  cross join lateral (
    select jsonb_build_object(
      'event_id', case g.n %% 50 when 7 then null
                                 when 11 then 9223372036854775807
                                 when 12 then -9223372036854775808
                                 else g.n * 1000003 - 500000000 end,
      'user_name', case when g.n %% 40 = 5 then null
                        when g.n %% 3 = 0 then (array['alice', 'Zoë', 'Łukasz', '日本語テキスト', 'שלום',
                                                      'مرحبا', 'emoji 🙂🚀', E'e\\u0301 combining', '',
                                                      E'quote " backslash \\\\ tab \\t newline \\n',
                                                      'Ελληνικά', E'\\u00a0nbsp'])[1 + ((g.n / 3) %% 12)::int]
                        else 'user_' || g.n end,
      'amount', case g.n %% 20 when 0 then to_jsonb(0.1)
                               when 1 then to_jsonb(1e-300::numeric)
                               when 2 then to_jsonb('NaN'::text)
                               when 3 then to_jsonb('Infinity'::text)
                               when 4 then to_jsonb('-Infinity'::text)
                               when 5 then null
                               when 6 then to_jsonb(5e-324::numeric)
                               when 7 then to_jsonb(1.7976931348623157e308::numeric)
                               when 8 then to_jsonb(-2.5)
                               when 9 then to_jsonb(0)
                               else to_jsonb(g.n::float8 / 7) end,
      'is_active', case when g.n %% 7 = 0 then null else g.n %% 2 = 0 end,
      'occurred_at', case when g.n %% 31 = 0 then null
                          when g.n %% 6 = 0 and g.n %% 4 = 0
                               then to_char(t.ts at time zone 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US') || 'Z'
                          else to_char((t.ts at time zone 'UTC') + make_interval(mins => t.off_min),
                                       case when g.n %% 5 = 0 then 'YYYY-MM-DD"T"HH24:MI:SS'
                                            else 'YYYY-MM-DD"T"HH24:MI:SS.US' end)
                               || case when t.off_min < 0 then '-' else '+' end
                               || to_char(abs(t.off_min) / 60, 'FM00') || ':'
                               || to_char(abs(t.off_min) %% 60, 'FM00') end,
      'event_date', case when g.n %% 29 = 0 then null
                         when g.n %% 1000 = 1 then '1969-12-31'
                         when g.n %% 1000 = 2 then '2024-02-29'
                         else to_char(date '2024-01-01' + ((g.n %% 3000)::int - 1500), 'YYYY-MM-DD') end,
      'payload', case g.n %% 9
                   when 0 then null
                   when 1 then jsonb_build_object(
                                 'tags', jsonb_build_array('a', 'b', 'ü'),
                                 'meta', jsonb_build_object('depth', jsonb_build_object(
                                           'n', g.n, 'ok', true, 'none', null, 'ratio', g.n::float8 / 3)),
                                 'label', 'naïve café')
                   when 2 then jsonb_build_array(1, 2.5, 'x', null, jsonb_build_object('k', 'v'))
                   when 3 then '{}'::jsonb
                   when 4 then '[]'::jsonb
                   when 5 then to_jsonb('plain string'::text)
                   when 6 then to_jsonb(g.n)
                   when 7 then 'true'::jsonb
                   else jsonb_build_object('id', g.n, 'score', round(g.n / 3.0, 4)) end
    ) as obj
  ) o
"""

_CUSTOMERS_SQL = """
insert into dataset_rows (dataset_id, row_index, created_at, data)
select %(ds)s, g.n, timestamptz '2023-01-01 00:00:00+00' + g.n * interval '1 hour',
       jsonb_build_object(
         'customer_id', g.n + 1,
         'name', (array['Ada', 'Bjørn', 'Chloé', 'Dmitri', '美咲', 'Ömer', 'Zoë'])[1 + (g.n %% 7)::int]
                 || ' #' || (g.n + 1),
         'email', case when g.n %% 11 = 0 then null else 'customer' || (g.n + 1) || '@example.com' end,
         'country', (array['FR', 'DE', 'JP', 'BR', 'US', 'IN', 'NG', 'NO'])[1 + (g.n %% 8)::int],
         'signup_date', to_char(date '2020-01-01' + (g.n %% 1461)::int, 'YYYY-MM-DD'),
         'vip', g.n %% 10 = 0,
         'lifetime_value', round((g.n * 37 %% 10000) / 3.0, 2))
  from generate_series(0::bigint, %(n)s::bigint - 1) as g(n)
"""

_ORDERS_SQL = """
insert into dataset_rows (dataset_id, row_index, created_at, data)
select %(ds)s, g.n, timestamptz '2024-01-01 00:00:00+00' + g.n * interval '90 seconds',
       jsonb_build_object(
         'order_id', 100000 + g.n,
         'customer_id', 1 + (g.n * 7919 %% %(customers)s),
         'amount', round((5 + (g.n * 13 %% 50000) / 100.0), 2),
         'status', (array['new', 'paid', 'shipped', 'refunded'])[1 + (g.n %% 4)::int],
         'ordered_at', to_char(timestamp '2024-01-01 00:00:00' + g.n * interval '90 seconds',
                               'YYYY-MM-DD"T"HH24:MI:SS') || '+01:00',
         'items', jsonb_build_array(
                    jsonb_build_object('sku', 'SKU-' || (g.n %% 97), 'qty', 1 + g.n %% 3),
                    jsonb_build_object('sku', 'SKU-' || (g.n %% 89), 'qty', 1, 'gift', g.n %% 5 = 0)))
  from generate_series(0::bigint, %(n)s::bigint - 1) as g(n)
"""

_ROLLUP_SQL = """
insert into dataset_rows (dataset_id, row_index, created_at, data)
select %(ds)s, row_number() over (order by c.country) - 1, timestamptz '2024-03-01 00:00:00+00',
       jsonb_build_object('country', c.country, 'customers', c.customers, 'revenue', c.revenue,
                          'computed_at', '2024-03-01T00:00:00+00:00')
  from (select r.data->>'country' as country, count(*) as customers,
               round(sum((r.data->>'lifetime_value')::numeric), 2) as revenue
          from dataset_rows r where r.dataset_id = %(src)s group by 1) c
"""


def seed_events(conn: psycopg.Connection, dataset_id: uuid.UUID, n: int) -> None:
    """``n`` rows of the big 'events' dataset: every JSON type, nulls as missing keys, edge values."""
    conn.execute(_EVENTS_SQL, {"ds": dataset_id, "n": n})


def seed_customers(conn: psycopg.Connection, dataset_id: uuid.UUID, n: int) -> None:
    """``n`` customers."""
    conn.execute(_CUSTOMERS_SQL, {"ds": dataset_id, "n": n})


def seed_orders(conn: psycopg.Connection, dataset_id: uuid.UUID, n: int, customers: int) -> None:
    """``n`` orders of customers 1..``customers``."""
    conn.execute(_ORDERS_SQL, {"ds": dataset_id, "n": n, "customers": customers})


def seed_rollup(conn: psycopg.Connection, dataset_id: uuid.UUID, customers_id: uuid.UUID) -> None:
    """The customers of dataset ``customers_id`` rolled up by country."""
    conn.execute(_ROLLUP_SQL, {"ds": dataset_id, "src": customers_id})
