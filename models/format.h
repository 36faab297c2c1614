// Number formats shared by the console's models: bytes in binary units, times.
#pragma once

#include <QString>

namespace fmt {

// "0 B", "12.3 KiB", "4.50 GiB".
QString bytes(qint64 bytes);
// "10:42:07.123" in local time from Unix epoch milliseconds.
QString timeOfDay(qint64 epochMs);
// "2026-12-07 10:42:07" (with milliseconds: "2026-12-07 10:42:07.123") in local time from Unix epoch milliseconds.
QString dateAndTime(qint64 epochMs, bool milliseconds = false);

}  // namespace fmt
