"""Layer 5, linking and packing: `cc` (cc/ld/tar wrappers), `elf` (the devc.o
writer), `blob` (the blob format and writer), `files` (atomic writes) and
`export` (devc.o and the .so/.tar: the steps export_library and doit share).
Imports only `errors`: the runtime loads it, so no compiler code here."""
