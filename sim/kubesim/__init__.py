"""A Kubernetes API server stand-in for member clusters, with a Kueue-like control loop.

Quartermaster reaches member clusters only through the official ``kubernetes``
client; no real API server can run where we test, demo and benchmark. This
package serves one (or several) in-memory clusters over HTTP(S) with the
Kubernetes REST semantics our reconcilers, ``kubectl`` and the dynamic client
rely on — discovery, every verb including server-side apply and watch, Status
errors, CRD schema and CEL validation against the real Kueue CRDs — and runs,
inside each cluster, a scheduler, a kubelet and a Kueue-like admission loop so
that jobs are queued, admitted, bound to nodes, run and finish. A member whose
backend is ``volcano`` serves Volcano's CRDs instead of Kueue's and runs a
Volcano-like gang scheduler and Job controller (``docs/volcano.md``).

Entry points: :func:`sim.kubesim.testing.running_cluster` for tests,
``quartermaster sim cluster`` for humans and standalone mode.
"""
