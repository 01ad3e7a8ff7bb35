"""The ground every stage stands on: file names, files, records, configs, errors.

- ``paths``: every file name the pipeline reads or writes;
- ``files``: YAML read fast, text written atomically (below config and records,
  importing neither);
- ``records``: versioned JSON records, read back only through the schema;
- ``config``: case configs loaded, checked against their schemas, defaults filled in;
- ``errors``: the one error type for bad input, and how scripts report it;
- ``jobprofile``: what one job spent, the last line of its log;
- ``provenance``: the commit and content hashes a record comes from;
- ``locks``: the one parser of the hash-pinned locks (standard library only);
- ``cases``: a case's plug-in loaded and held to ``kernels.contract``;
- ``plugin_answers``: the plug-in's answers to the config check, kept by source hash;
- ``stand_ins``: what runs in a kernel's place on a host without its device;
- ``speed_of_light``: the bound no measured time may beat;
- ``fmt``: human units for numbers on figures and pages.
"""
