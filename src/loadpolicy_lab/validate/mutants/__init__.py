"""`loadpolicy dev mutants`: the mutation table (`table`, its rows by subject in `rows_*`, one row's type in `row`),
the checks that must catch each row (`checks`), running them (`run`, two at a time with `--jobs 2`), the probe that
shows each mutated line runs on its check's way (`paths`, `probe_hook`), the fast check of the table CI runs
(`table_check`) and the command line (`command`)."""
