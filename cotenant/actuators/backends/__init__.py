"""Actuator backends, each implementing :class:`actuators.backend.Backend`.

``gateway`` (the bundled gateway's control API), ``rayserve`` (Ray Serve's REST API),
``triton`` (Triton's model repository API, explicit mode), ``webhook`` (signed JSON POST).
The simulator's backend (virtual time) lives above the simulator, in
:mod:`evaluation.sim_backend`. The HTTP ones share
:class:`actuators.backends.http.HttpCaller`; :func:`actuators.backends.factory.make_backend`
builds one from the ``[actuators]`` config.
"""
