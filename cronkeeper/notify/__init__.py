"""Being told (docs/notifications.md): the notify config (``config``), what each sink receives
(``messages``), sending it (``sinks``), the sender thread of ``run`` and ``worker``
(``sender``), and the leader's heartbeat ping (``heartbeat``). The events themselves are noted by
the database statements that record them (``cronkeeper.db.notifications``)."""
