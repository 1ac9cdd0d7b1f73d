"""Layer 5, linking and packing: `cc` (cc/ld/tar wrappers), `elf` (the devc.o
writer), `blob` (the blob format and writer) and `files` (atomic writes).
Imports only `errors`: the runtime loads it, so no compiler code here."""
