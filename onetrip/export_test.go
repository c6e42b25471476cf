package onetrip

// SQLInsertAndTake is the HELD path's one statement, for the layered
// benchmark (layers_test.go), which sends it without the strategy.
const SQLInsertAndTake = sqlInsertAndTake
