"""Where the analysts' commands read from: a broker and a deployment's public topic names, and the
deployment as its published descriptor describes it (:mod:`pipeline.descriptor`).

An analyst needs only the broker address and the deployment's name; a configuration is optional,
and when given it is checked against the published fingerprint document (refused with the differing
keys named, exit 2, as the processes refuse a configuration that is not the deployment's). Its
curator files (the roster) are not needed: n comes from the descriptor.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import TYPE_CHECKING

from pipeline.stream.kafka.topics import PUBLIC_TOPICS

from .reader import AnalystError, NotReleased, PublicReader

if TYPE_CHECKING:
    from pipeline.config import Deployment

__all__ = ["ConfigurationDiffers", "NoSuchDeployment", "PublicSource", "public_names"]


class ConfigurationDiffers(AnalystError):
    """The configuration given is not the deployment's (exit code 2)."""


class NoSuchDeployment(AnalystError):
    """The broker has no deployment of the name given, or not all its public topics (exit code 2);
    nothing was created on the broker (:mod:`pipeline.stream.kafka.topic_presence`)."""


def public_names(prefix: str, deployment: str) -> dict[str, str]:
    """Logical -> broker topic names of a deployment known only by its name and topic prefix."""
    from pipeline.stream.kafka.topics import topic_names

    return topic_names(SimpleNamespace(name=deployment, topics=SimpleNamespace(prefix=prefix)))


@dataclass
class PublicSource:
    broker: str
    names: dict[str, str]
    deployment_name: str
    config: Deployment | None = None  # an analyst's Deployment, checked against the descriptor

    def read(self, timeout: float = 30.0, store=None) -> PublicReader:
        """Every public topic to its end (into ``store``), then a reader over them."""
        from pipeline.consumer import read_topics
        from pipeline.stream.kafka.topic_presence import TopicsMissing

        public = {t: self.names[t] for t in PUBLIC_TOPICS}
        try:
            store = read_topics(self.broker, public, store=store, timeout=timeout)
        except TopicsMissing as err:
            raise NoSuchDeployment(str(err.of_deployment(self.deployment_name, public))) from None
        return PublicReader(self.deployment(store.descriptor), store)

    def deployment(self, published: dict | None):
        """The deployment to read with: the descriptor's, once a given configuration matches it."""
        from pipeline import descriptor

        if published is None:
            return self._without_descriptor()
        if self.config is not None:
            changes = descriptor.differences(self.config, published, _roster_ids(self.config))
            if changes:
                raise ConfigurationDiffers(
                    f"the configuration is not deployment {self.deployment_name!r}'s: its "
                    "privacy-relevant keys differ from the published descriptor "
                    f"({self.names['deployment']}): {'; '.join(changes)}. Its answers would be "
                    "read with the wrong n, bounds or spend; drop --config (the descriptor says "
                    "everything the commands need) or fix it"
                )
        try:
            return descriptor.deployment_from(published)
        except ValueError as err:
            raise AnalystError(f"{self.names['deployment']}: {err}") from None

    def _without_descriptor(self):
        """No descriptor published yet: the configuration, if it is usable."""
        where, name = self.names["deployment"], self.deployment_name
        if self.config is None:
            raise NotReleased(
                f"deployment {name!r} has published no descriptor on {where} yet "
                "(its releaser has not started, or is of a version before the "
                "descriptor): pass the deployment's --config"
            )
        try:
            self.config.n  # noqa: B018 - a roster file is read here
        except OSError as err:
            raise AnalystError(
                f"deployment {name!r} has published no descriptor on {where}, and n "
                "cannot be read from the configuration: roster file "
                f"{err.filename}: {err.strerror}"
            ) from None
        return self.config


def _roster_ids(config) -> list[str] | None:
    """The configuration's roster ids, or None when its file is not there (an analyst's copy)."""
    from pipeline.stream.ingest.roster import Roster

    try:
        return Roster.from_config(config.roster).ids
    except OSError:
        return None
