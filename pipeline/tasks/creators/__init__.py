"""The doit task creators, one module per stage family, in pipeline order:
model (model, import), optimize (optimize, kernel), link (lib0, devc, runtime,
export, build), check (validate, bench, conformance), housekeeping (report,
explain, gc). Each creator takes the run's Selection (pipeline.tasks.selection)
and only describes tasks; each module lists its creators in CREATORS, and
pipeline.tasks.make_tasks hands them to doit in that order."""
