"""`Bounds`: every kind of bound of one search run, sharing one set of caches."""

from __future__ import annotations

from hetopt.cost.profiles import Profiles
from hetopt.search.bounds.families import FamilyBounds
from hetopt.search.bounds.memory import MemoryBounds
from hetopt.search.bounds.pairs import PairBounds
from hetopt.search.bounds.reach import TemplateReach
from hetopt.search.bounds.sends import SendBounds
from hetopt.search.bounds.skeletons import SkeletonBounds
from hetopt.search.bounds.templates import TemplateBounds
from hetopt.search.bounds.triples import TripleBounds
from hetopt.spec.instance import Instance


class Bounds:
    """The bounds and memory tests of one search run over `inst`, priced by `profiles`.

    Parameters: inst — the instance; profiles — the calibrated weights the evaluator uses;
    clusters — every cluster a plan is timed on (the planning scenarios'; default the instance's):
    a send is bounded by its fastest. Every bound is memoised on this object only.
    """

    def __init__(self, inst: Instance, profiles: Profiles, clusters: list | None = None) -> None:
        self.inst, self.profiles = inst, profiles
        self.sends = SendBounds(inst, profiles, clusters)
        self.memory = MemoryBounds(inst, profiles)
        self.templates = TemplateBounds(self.sends, self.memory)
        self.families = FamilyBounds(self.templates)
        self.reach = TemplateReach(self.templates)
        self.pairs = PairBounds(self.templates, self.reach)
        self.triples = TripleBounds(self.templates, self.reach)
        self.skeletons = SkeletonBounds(self.templates)
