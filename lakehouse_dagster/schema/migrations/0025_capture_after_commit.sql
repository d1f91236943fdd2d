-- Two capture modes (tracking/capture.py): triggers, and after-commit (the previous release's wal-tracking,
-- renamed: change tracking and the digest written by the WAL consumer after the app commits). A database left
-- in wal-tracking is renamed here, with nothing else changed (its triggers, slot and consumer state are those
-- of after-commit already), and a note `lakehouse db migrate` prints once. 'wal' is still allowed: a database
-- left in it is moved to one of the two by migrate's capture step (capture.upgrade_from_previous_release),
-- which needs the slot's health and a table lock, not SQL alone. The switch table keeps the old names: its
-- rows are history, and the consumer reads the ones still in the slot (it knows the old names).
alter table lakehouse_digest_capture add column if not exists upgrade_note text;
alter table lakehouse_digest_capture drop constraint if exists lakehouse_digest_capture_mode_check;
update lakehouse_digest_capture
   set mode = 'after-commit',
       upgrade_note = 'capture mode wal-tracking is now named after-commit (the same mode: change tracking and the'
                      ' digest written by the WAL consumer after the app commits); nothing was switched'
 where mode = 'wal-tracking';
alter table lakehouse_digest_capture add constraint lakehouse_digest_capture_mode_check
  check (mode in ('triggers', 'after-commit', 'wal'));
alter table lakehouse_digest_capture_switch drop constraint if exists lakehouse_digest_capture_switch_mode_check;
alter table lakehouse_digest_capture_switch add constraint lakehouse_digest_capture_switch_mode_check
  check (mode in ('triggers', 'after-commit', 'wal', 'wal-tracking'));
