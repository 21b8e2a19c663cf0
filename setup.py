"""Which packages the wheel holds: every package under hetopt/, found, not listed.

Two folders at the top of the repository ship inside hetopt: `formulations/` (the plug-ins) as
`hetopt.formulations` and `instances/` (the bundled instances) as `hetopt.bundled`. setuptools'
`[tool.setuptools.packages.find]` names a package after its folder, so it cannot map these two;
discovery is done here instead, and nothing else of the build lives in this file.
"""

from setuptools import find_packages, setup

MAPPED = {"hetopt.formulations": "formulations", "hetopt.bundled": "instances"}

setup(packages=[*find_packages(include=["hetopt", "hetopt.*"]), *MAPPED], package_dir=MAPPED)
