"""The running service, wired from configuration: ``config`` (the TOML file and environment),
``service`` (serve and agent), ``central`` and ``fleet`` (fleet mode), the HTTP APIs
(``api``, ``agent_api``), ``listen`` (the HTTP server), ``auth``, ``log_format`` and
``build_info``. See docs/architecture.md."""
