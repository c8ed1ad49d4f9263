package lockdown

// archAllowTable adds arm64's own calls to allowTable: none, arm64 has only
// the *at and p* forms the common table lists.
func archAllowTable() []allow { return nil }
