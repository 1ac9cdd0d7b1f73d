"""Layer 6, linking and packing: `cc` (wrappers of a target's compiler and tar),
`elf` (the devc.o writer), `blob` (the blob format, its ELF and C writers), `files`
(atomic writes) and `export` (devc.o and the .so/.tar/.o: the steps export_library
and doit share). Only `export` imports `ir` (a target's machine and ELF flags): the
runtime loads the others, which import only `errors`, so no compiler code there."""
