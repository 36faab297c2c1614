// One vocabulary for the settings document on every screen: a field's label and unit, and an area's
// title and the screen it belongs to, so the Settings screen reads like the screens it configures.
#pragma once

#include <QString>

struct SettingWords {
  QString label;     // "Ceiling between requests"
  QString unit;      // the editor's suffix: " GiB", " days", " tokens", or ""
  int decimals = 0;  // a number's editor
};

// The words of a key ("memory.ceiling_gb"); unknown keys get words made from their name.
SettingWords WordsForSetting(const QString& key);
// The Settings screen's title of an area ("Memory: limits") and its rank (areas of one screen together).
QString SettingsAreaTitle(const QString& area);
int SettingsAreaRank(const QString& area);
