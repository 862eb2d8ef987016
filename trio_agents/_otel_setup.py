"""Setting up OpenTelemetry's SDK for :mod:`trio_agents.otel` from the standard ``OTEL_*``
variables: :func:`configure` and what it answers, :class:`Telemetry`.  The SDK is imported
here, when :func:`configure` is called, never by the hooks (``trio-agents[otel]``)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from importlib.metadata import entry_points
from typing import Any

import attrs
from opentelemetry import metrics, trace

from ._exceptions import UsageError

__all__ = ["Telemetry", "configure"]


@attrs.define
class Telemetry:
    """What :func:`configure` set up; :meth:`shutdown` flushes and stops the exporters."""

    tracer_provider: Any
    meter_provider: Any

    def shutdown(self) -> None:
        """Export what is buffered, then stop (blocking; call it once, at exit)."""
        for provider in (self.tracer_provider, self.meter_provider):
            if provider is not None:
                provider.shutdown()


def _exporter(group: str, names: Sequence[str]) -> list[Any]:
    made: list[Any] = []
    for name in names:
        name = name.strip()
        if not name or name == "none":
            continue
        found = entry_points(group=group, name=name)
        if not found:
            raise UsageError(
                f"no OpenTelemetry exporter {name!r} ({group}); install its package "
                "(e.g. opentelemetry-exporter-otlp for 'otlp') or choose 'console' or 'none'"
            )
        made.append(next(iter(found)).load()())
    return made


def configure(*, service_name: str | None = None, set_global: bool = True) -> Telemetry:
    """Set up the OpenTelemetry SDK from the standard ``OTEL_*`` variables; return it.

    ``OTEL_SDK_DISABLED=true`` sets up nothing.  ``OTEL_TRACES_EXPORTER`` and
    ``OTEL_METRICS_EXPORTER`` (default ``otlp``; ``console``, ``none``, or any installed
    exporter's name, comma-separated) choose the exporters; ``OTEL_SERVICE_NAME`` and
    ``OTEL_RESOURCE_ATTRIBUTES`` the resource (``service_name`` is the default name); spans go
    through a ``BatchSpanProcessor`` (``OTEL_BSP_*``) and metrics through a periodic reader
    (``OTEL_METRIC_EXPORT_INTERVAL``).  Exemplars are off unless
    ``OTEL_METRICS_EXEMPLAR_FILTER`` is set: the SDK's default (``trace_based``) samples an
    exemplar at every histogram record made under a sampled span - every record of ours -
    which costs each record more than the record itself; set the variable to ``trace_based``
    (or ``always_on``) to have them.  With ``set_global`` the providers become the global
    ones, which :class:`OTelHooks` uses by default.  Needs ``trio-agents[otel]``.
    """
    try:
        from opentelemetry.sdk.metrics import AlwaysOffExemplarFilter, MeterProvider
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
        from opentelemetry.sdk.resources import OTELResourceDetector, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as exc:  # pragma: no cover - the extra is missing
        raise UsageError(
            "OpenTelemetry's SDK is not installed: pip install 'trio-agents[otel]'"
        ) from exc
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return Telemetry(tracer_provider=None, meter_provider=None)
    defaults = {"service.name": service_name} if service_name else {}
    resource = Resource.create(defaults).merge(OTELResourceDetector().detect())
    if "OTEL_SERVICE_NAME" in os.environ:
        resource = resource.merge(Resource({"service.name": os.environ["OTEL_SERVICE_NAME"]}))
    tracer_provider = TracerProvider(resource=resource)
    traces = os.environ.get("OTEL_TRACES_EXPORTER", "otlp").split(",")
    for exporter in _exporter("opentelemetry_traces_exporter", traces):
        tracer_provider.add_span_processor(BatchSpanProcessor(exporter))
    metrics_names = os.environ.get("OTEL_METRICS_EXPORTER", "otlp").split(",")
    readers = [
        PeriodicExportingMetricReader(exporter)
        for exporter in _exporter("opentelemetry_metrics_exporter", metrics_names)
    ]
    # None: the SDK reads OTEL_METRICS_EXEMPLAR_FILTER (see the docstring).
    exemplars = None if "OTEL_METRICS_EXEMPLAR_FILTER" in os.environ else AlwaysOffExemplarFilter()
    meter_provider = MeterProvider(
        resource=resource, metric_readers=readers, exemplar_filter=exemplars
    )
    if set_global:
        trace.set_tracer_provider(tracer_provider)
        metrics.set_meter_provider(meter_provider)
    return Telemetry(tracer_provider=tracer_provider, meter_provider=meter_provider)
