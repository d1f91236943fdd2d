"""The ground floor: settings, errors, ids, failpoints, Postgres connections, the embedded server, the cross-process guards."""
