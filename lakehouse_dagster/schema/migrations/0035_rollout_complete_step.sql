-- A rollout plan may end with a `complete` stage (plans/spec.py, issue 31): its step is the `complete` job's run
-- over the datasets the plan moved, recorded like a flip or an analysis step so that a daemon killed mid-stage asks
-- for the same run again (its run key) and an abort waits for it to end.
alter table lakehouse_rollout_steps drop constraint if exists lakehouse_rollout_steps_kind_check;
alter table lakehouse_rollout_steps add constraint lakehouse_rollout_steps_kind_check
  check (kind in ('flip', 'analysis', 'complete'));
