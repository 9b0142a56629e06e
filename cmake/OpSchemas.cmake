# The ops python/vendored_flash_attn calls with positional arguments must have the schemas
# the flash-attention being built registers: cmake/vfa_build/knobs/op_schemas.py reads upstream's
# registration sources (their ops.def strings) and compares them with
# python/vendored_flash_attn/declaration/op_schemas.py. A pin bump (or a FLASH_ATTN_SRC_DIR) whose ops
# take other arguments stops here, not in a wheel whose calls shift the arguments.
# Included once, after the sources are resolved and Python is found.

include_guard(GLOBAL)
include(${CMAKE_CURRENT_LIST_DIR}/BuildPython.cmake)  # VFA_BUILD_PY

set(_vfa_schema_command "${Python_EXECUTABLE}" -E -s -S "${VFA_BUILD_PY}" knobs.op_schemas check
    "${VFA_flash_attention_SOURCE_DIR}")
if(VFA_flash_attention_MATCHES_PIN)
  # Only a source verified to be its commit may be recorded as checked at that commit.
  list(APPEND _vfa_schema_command --commit "${VFA_flash_attention_COMMIT}")
endif()
execute_process(COMMAND ${_vfa_schema_command}
  OUTPUT_VARIABLE _vfa_schema_out ERROR_VARIABLE _vfa_schema_err RESULT_VARIABLE _vfa_schema_rc
  OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_STRIP_TRAILING_WHITESPACE)
if(NOT _vfa_schema_rc EQUAL 0)
  message(FATAL_ERROR "vendored-flash-attn: flash-attention in ${VFA_flash_attention_SOURCE_DIR} "
    "(commit ${VFA_flash_attention_COMMIT}):\n${_vfa_schema_err}")
endif()
message(STATUS "vendored-flash-attn: op schemas: ${_vfa_schema_out}")
