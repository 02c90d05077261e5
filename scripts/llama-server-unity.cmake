# Loaded by scripts/build-llama-server.sh as CMAKE_PROJECT_INCLUDE: it runs after each project()
# call in llama.cpp's tree. The build is a unity build (CMAKE_UNITY_BUILD=ON: several .cpp files
# of a target compiled as one, so the heavy headers such as nlohmann/json are parsed once per
# batch instead of once per file), measured at 30% less compiler time than one file at a time.
# Two parts of the tree are not written for that, and are compiled file by file:
#   - ggml, whose CPU back end defines the same block_* names differently in different files;
#   - three files that must see only public headers (mtmd-helper*.cpp check it with #error) or
#     that specialise a template another file of their batch has already instantiated (json.cpp).
# Each is a compile error, never a silent change: a new llama.cpp release that adds such a file
# fails the build here, and the file joins the list below.
# llama.cpp's own CMake batches only llama's model sources (src/models/*.cpp) and compiles its
# 32 core sources (src/llama*.cpp, unicode*.cpp) one by one, each parsing the same headers
# again. They join the batches here, but for llama-kv-cache-dsv4.cpp, whose static
# dsv4_plan_positions() llama-graph.cpp defines too. On 2 idle cores that cut the whole build's
# CPU by 12-20% (scripts/build-llama-server.sh has the figures), and all 19 llama.cpp tests
# passed against the binary.
if(PROJECT_NAME STREQUAL "ggml")
  set(CMAKE_UNITY_BUILD OFF)
elseif(PROJECT_NAME STREQUAL "llama.cpp")
  function(specdecode_unity_exceptions)
    set_property(SOURCE
      "${CMAKE_SOURCE_DIR}/tools/mtmd/mtmd-helper.cpp"
      "${CMAKE_SOURCE_DIR}/tools/mtmd/mtmd-helper-gen.cpp"
      TARGET_DIRECTORY mtmd PROPERTY SKIP_UNITY_BUILD_INCLUSION ON)
    set_property(SOURCE "${CMAKE_SOURCE_DIR}/common/json.cpp"
      TARGET_DIRECTORY llama-common PROPERTY SKIP_UNITY_BUILD_INCLUSION ON)
    get_target_property(llama_sources llama SOURCES)
    foreach(source IN LISTS llama_sources)
      if(source MATCHES "^(llama|unicode).*\\.cpp$" AND NOT source STREQUAL "llama-kv-cache-dsv4.cpp")
        set_property(SOURCE "${CMAKE_SOURCE_DIR}/src/${source}"
          TARGET_DIRECTORY llama PROPERTY SKIP_UNITY_BUILD_INCLUSION OFF)
      endif()
    endforeach()
  endfunction()
  # at the end of the top directory, when every target exists
  cmake_language(DEFER DIRECTORY "${CMAKE_SOURCE_DIR}" CALL specdecode_unity_exceptions)
endif()
