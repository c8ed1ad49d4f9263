package lockdown

// precompiled is nil: no arm64 filter is compiled in yet (its generator,
// TestPrecompiledFilter -update, runs on the architecture it compiles
// for), so Apply builds the filter at each start.
var precompiled *precompiledFilter
