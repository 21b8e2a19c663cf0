"""Plans as launcher files: the rank map (`rankmap`), each launcher's arguments and configs
(`launchers`), the files written all or none (`files`), the plans a launcher runs as they are
(`runnable`), and a dry run of the rank map on gloo (`dryrun`)."""
