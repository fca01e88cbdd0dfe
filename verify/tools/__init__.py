"""The bodies of the command-line tools behind `verify.cli`: `calibration` (noise floors and
tolerances measured), `doctor` (the machine checked), `case_scaffold` (`init`: a case module
written from a migration's entry points) and `name_proposals` (`names`: a name map proposed).
"""
