# Writes OUT, a header defining MSA_BUILD_COMMIT: the git commit of SRC ("<hash>", "<hash>-dirty"
# when tracked files differ from it, "unknown" outside a git checkout). Run at every build; the
# header is replaced only when its text changes, so a rebuild of the same commit compiles nothing.
execute_process(COMMAND git -C "${SRC}" rev-parse HEAD OUTPUT_VARIABLE commit
                RESULT_VARIABLE rc OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
if(NOT rc EQUAL 0 OR commit STREQUAL "")
  set(commit unknown)
else()
  execute_process(COMMAND git -C "${SRC}" diff --quiet HEAD -- RESULT_VARIABLE dirty ERROR_QUIET)
  if(dirty EQUAL 1)
    string(APPEND commit "-dirty")
  endif()
endif()
file(WRITE "${OUT}.tmp" "#define MSA_BUILD_COMMIT \"${commit}\"\n")
file(COPY_FILE "${OUT}.tmp" "${OUT}" ONLY_IF_DIFFERENT)
file(REMOVE "${OUT}.tmp")
